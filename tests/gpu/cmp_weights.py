#!/usr/bin/env python3
"""cmp_weights.py A B TOL - compares two safetensors weight files tensor by
tensor (F32 only): prints the largest relative difference ||a - b|| / ||b||
and the tensor it is in; exit status 0 when every tensor's is below TOL
(NaN never passes), 1 otherwise, 2 when the files do not match in names or
shapes. No numpy needed."""
import array
import json
import math
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']} (expected F32)")
        a, b = t["data_offsets"]
        v = array.array("f")
        v.frombytes(data[a:b])
        out[name] = (tuple(t["shape"]), v)
    return out


def main():
    pa, pb, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a, b = load(pa), load(pb)
    if sorted(a) != sorted(b) or any(a[k][0] != b[k][0] for k in a):
        print(f"{pa} and {pb} hold different tensors")
        return 2
    worst, at = 0.0, ""
    for k in sorted(a):
        x, y = a[k][1], b[k][1]
        d = math.sqrt(sum((p - q) * (p - q) for p, q in zip(x, y)))
        r = math.sqrt(sum(q * q for q in y))
        e = d / r if r > 0 else (0.0 if d == 0 else math.inf)
        if not (e <= worst):  # NaN stays
            worst, at = e, k
    print(f"max rel diff {worst:.3e} ({at}), {len(a)} tensors")
    return 0 if worst < tol else 1


if __name__ == "__main__":  # tests/cudafake/zero.sh imports load
    sys.exit(main())
