#!/usr/bin/env python3
"""torch_gpt2.py - the PyTorch peer of models/gpt.lua: the same model (learned
token and position embeddings, pre-LN blocks with causal self-attention and
a GELU MLP, final LayerNorm, head tied to the token embedding; dropout 0),
trained with AdamW (betas 0.9, 0.95, weight decay 0.1, gradient clipping at
1) on random tokens. Two users:
  - tests/gpu/run.sh: GPT-2 124M (the defaults) on CUDA in bf16 autocast
    (f32 master weights), eager or torch.compile;
  - bench/vs_pytorch.sh: gpt.lua small on the CPU in f32 (--device cpu
    --dtype f32 --L 4 --C 256 --H 4 --V 512 --seq 256 --batch 8 --threads 2).
Prints per-step times, then one summary line:
    median X ms/step | Y tok/s | MFU Z% (FLOPs 6N + 12 L T C per token)
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # Debian's torch 1.13: the same attention, written out
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, C, L, H):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for m in self.modules():  # GPT-2's init, as gpt.lua's (the loss starts near ln V)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--peak-gflops", type=float, default=989000.0)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--L", type=int, default=12)
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--V", type=int, default=50257)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (CPU)")
    a = ap.parse_args()
    V, T, C, L, H = a.V, a.seq, a.C, a.L, a.H
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = a.device
    cuda = dev == "cuda"
    model = GPT(V, T, C, L, H).to(dev)
    nparams = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    step_fn = model
    if a.mode == "compile":
        step_fn = torch.compile(model)
    g = torch.Generator(device=dev).manual_seed(1)
    times = []
    for s in range(a.steps):
        idx = torch.randint(0, V, (a.batch, T), device=dev, generator=g)
        tgt = torch.randint(0, V, (a.batch, T), device=dev, generator=g)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = step_fn(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()
        dt = time.perf_counter() - t0
        times.append(dt)
        print(f"step {s + 1:4d} | loss {lv:.4f} | {dt * 1e3:8.2f} ms", flush=True)
    steady = times[max(3, a.steps // 3):]
    med = statistics.median(steady)
    tokens = a.batch * T
    flops = (6 * nparams + 12 * L * T * C) * tokens
    mfu = flops / med / (a.peak_gflops * 1e9) * 100
    print(f"median {med * 1e3:.2f} ms/step | {tokens / med:.0f} tok/s | MFU {mfu:.1f}% "
          f"({flops / 1e12:.2f} TFLOP/step, torch {torch.__version__})")


if __name__ == "__main__":
    main()
