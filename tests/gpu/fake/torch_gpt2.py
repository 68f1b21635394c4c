#!/usr/bin/env python3
"""tests/gpu/fake/torch_gpt2.py - the rehearsal's stand-in for
tests/gpu/torch_gpt2.py (tests/gpu/rehearse.sh): takes the same flags and
prints lines of the same form, with made-up times, so that run.sh's parsing
of them runs without PyTorch or a GPU."""
import argparse

p = argparse.ArgumentParser()
for f in ("--mode", "--batch", "--seq", "--steps", "--peak-gflops"):
    p.add_argument(f)
a = p.parse_args()
for s in range(int(a.steps)):
    print(f"step {s + 1:4d} | loss 10.0000 | {100.0:8.2f} ms", flush=True)
print(f"median 100.00 ms/step | {int(a.batch) * int(a.seq) * 10} tok/s | MFU 1.0% "
      f"(fake {a.mode}, no torch)")
