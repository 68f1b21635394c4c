"""Greedy decoding with a KV cache in PyTorch eager, for bench/sample_cpu.sh:
a GPT-2 style model of gpt.lua's shapes (pre-LayerNorm, GELU tanh, tied
head), random weights, batch B, one prompt token, N new tokens (within T).
Prints "torch: B rows x N tokens in S s: R tokens/s".

  python3 bench/sample_torch.py L C H V T B N THREADS
"""
import math
import sys
import time

import torch
import torch.nn.functional as F

L, C, H, V, T, B, N, threads = (int(a) for a in sys.argv[1:9])
torch.set_num_threads(threads)
torch.manual_seed(0)
D = C // H


def w(*s):
    return torch.randn(*s) * 0.02


wte, wpe = w(V, C), w(T, C)
layers = [dict(ln1=(torch.ones(C), torch.zeros(C)), attn=w(C, 3 * C), attn_b=torch.zeros(3 * C),
               proj=w(C, C), proj_b=torch.zeros(C), ln2=(torch.ones(C), torch.zeros(C)),
               fc=w(C, 4 * C), fc_b=torch.zeros(4 * C), fc2=w(4 * C, C), fc2_b=torch.zeros(C))
          for _ in range(L)]
lnf = (torch.ones(C), torch.zeros(C))


@torch.no_grad()
def step(tok, pos, kc, vc):
    """tok [B] at position pos; kc, vc per layer [B, H, T, D], written at pos."""
    x = wte[tok] + wpe[pos]                                # [B, C]
    for i, p in enumerate(layers):
        h = F.layer_norm(x, (C,), *p["ln1"])
        q, k, v = (h @ p["attn"] + p["attn_b"]).split(C, -1)
        kc[i][:, :, pos] = k.view(B, H, D)
        vc[i][:, :, pos] = v.view(B, H, D)
        att = (q.view(B, H, 1, D) @ kc[i][:, :, :pos + 1].transpose(-1, -2)) / math.sqrt(D)
        y = (att.softmax(-1) @ vc[i][:, :, :pos + 1]).reshape(B, C)
        x = x + y @ p["proj"] + p["proj_b"]
        h = F.layer_norm(x, (C,), *p["ln2"])
        x = x + F.gelu(h @ p["fc"] + p["fc_b"], approximate="tanh") @ p["fc2"] + p["fc2_b"]
    return F.layer_norm(x, (C,), *lnf) @ wte.T            # [B, V]


kc = [torch.zeros(B, H, T, D) for _ in range(L)]
vc = [torch.zeros(B, H, T, D) for _ in range(L)]
tok = torch.zeros(B, dtype=torch.long)
t0 = time.perf_counter()
for pos in range(N):
    tok = step(tok, pos, kc, vc).argmax(-1)
s = time.perf_counter() - t0
print(f"torch: {B} rows x {N} tokens in {s:.3f} s: {B * N / s:.1f} tokens/s")
