#!/usr/bin/env python3
"""make_tokens.py PATH COUNT VOCAB - an llm.c token file (.bin: 256 int32
header with magic 20240520, version 1, token count; then uint16 tokens) of
COUNT pseudo-random tokens below VOCAB, for speed runs without a download."""
import array
import random
import sys

path, count, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
header = array.array("i", [0] * 256)
header[0], header[1], header[2] = 20240520, 1, count
rnd = random.Random(1337)
tokens = array.array("H", (rnd.randrange(vocab) for _ in range(count)))
with open(path, "wb") as f:
    header.tofile(f)
    tokens.tofile(f)
