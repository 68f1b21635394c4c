"""The GPT of models/gpt.lua in JAX: the same training step (forward,
backward, global-norm clipping, AdamW with bias correction and weight decay
on matrices) jit-compiled for the CPU. Prints the median ms per step.

Usage: python fusion_jax_gpt.py L C H T B V STEPS
"""
import sys
import time

import jax
import jax.numpy as jnp

L, C, H, T, B, V, STEPS = (int(a) for a in sys.argv[1:8])
BETA1, BETA2, EPS, WD, CLIP, LR = 0.9, 0.95, 1e-8, 0.1, 1.0, 1e-3


def init(key):
    ks = iter(jax.random.split(key, 8 + 8 * L))
    n = lambda shape, std: std * jax.random.normal(next(ks), shape, jnp.float32)
    proj = 0.02 / (2 * L) ** 0.5
    p = {"wte": n((V, C), 0.02), "wpe": n((T, C), 0.01),
         "lnf_w": jnp.ones(C), "lnf_b": jnp.zeros(C)}
    for i in range(L):
        p[f"h{i}"] = {
            "ln1_w": jnp.ones(C), "ln1_b": jnp.zeros(C),
            "attn_w": n((C, 3 * C), 0.02), "attn_b": jnp.zeros(3 * C),
            "proj_w": n((C, C), proj), "proj_b": jnp.zeros(C),
            "ln2_w": jnp.ones(C), "ln2_b": jnp.zeros(C),
            "fc_w": n((C, 4 * C), 0.02), "fc_b": jnp.zeros(4 * C),
            "fc2_w": n((4 * C, C), proj), "fc2_b": jnp.zeros(C),
        }
    return p


def layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdims=True)
    return xc * jax.lax.rsqrt(var + 1e-5) * w + b


def gelu(x):
    return 0.5 * x * (1 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def block(p, x):
    h = layernorm(x, p["ln1_w"], p["ln1_b"])
    qkv = h @ p["attn_w"] + p["attn_b"]
    q, k, v = jnp.split(qkv, 3, axis=-1)
    heads = lambda t: t.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
    q, k, v = heads(q), heads(k), heads(v)
    att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / (C // H) ** 0.5)
    mask = jnp.tril(jnp.ones((T, T), bool))
    att = jnp.where(mask, att, -1e9)
    att = jax.nn.softmax(att, axis=-1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    x = x + y @ p["proj_w"] + p["proj_b"]
    h = layernorm(x, p["ln2_w"], p["ln2_b"])
    return x + gelu(h @ p["fc_w"] + p["fc_b"]) @ p["fc2_w"] + p["fc2_b"]


def loss_fn(p, tokens, targets):
    x = p["wte"][tokens] + p["wpe"][None, :, :]
    for i in range(L):
        x = block(p[f"h{i}"], x)
    x = layernorm(x, p["lnf_w"], p["lnf_b"])
    logits = x @ p["wte"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], -1).mean()


@jax.jit
def step(p, m, v, t, tokens, targets):
    loss, g = jax.value_and_grad(loss_fn)(p, tokens, targets)
    leaves = jax.tree_util.tree_leaves(g)
    norm = jnp.sqrt(sum(jnp.sum(x * x) for x in leaves))
    scale = jnp.minimum(1.0, CLIP / (norm + 1e-6))
    t = t + 1
    c1, c2 = 1 - BETA1 ** t, 1 - BETA2 ** t

    def upd(p_, g_, m_, v_):
        g_ = g_ * scale
        m_ = BETA1 * m_ + (1 - BETA1) * g_
        v_ = BETA2 * v_ + (1 - BETA2) * g_ * g_
        u = (m_ / c1) / (jnp.sqrt(v_ / c2) + EPS)
        if p_.ndim >= 2:
            u = u + WD * p_
        return p_ - LR * u, m_, v_

    out = jax.tree_util.tree_map(upd, p, g, m, v)
    istuple = lambda z: isinstance(z, tuple)
    p = jax.tree_util.tree_map(lambda z: z[0], out, is_leaf=istuple)
    m = jax.tree_util.tree_map(lambda z: z[1], out, is_leaf=istuple)
    v = jax.tree_util.tree_map(lambda z: z[2], out, is_leaf=istuple)
    return p, m, v, t, loss


def main():
    key = jax.random.PRNGKey(0)
    p = init(key)
    m = jax.tree_util.tree_map(jnp.zeros_like, p)
    v = jax.tree_util.tree_map(jnp.zeros_like, p)
    t = jnp.float32(0)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, V)
    targets = jnp.roll(tokens, -1, axis=1)
    p, m, v, t, loss = step(p, m, v, t, tokens, targets)  # compile
    loss.block_until_ready()
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        p, m, v, t, loss = step(p, m, v, t, tokens, targets)
        loss.block_until_ready()
        times.append(1e3 * (time.perf_counter() - t0))
    times.sort()
    print(f"jax {jax.__version__} median_ms {times[len(times) // 2]:.3f} loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
