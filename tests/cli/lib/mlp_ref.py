# mlp_ref.py - an independent CPU forward of tests/data/tensors_mlp.lua
# (logits = relu(x @ fc.weight + fc.bias) @ head.weight + head.bias), in
# plain Python doubles (no numpy), for kiln eval and kiln predict's tests.
#   python3 mlp_ref.py WEIGHTS.safetensors DATA.safetensors [N]
# prints: the mean cross-entropy over the first N examples (default: all),
# the count of examples whose argmax is y, and N; with env LOGITS=FILE also
# writes every example's logits, one line of 3 numbers per example.
import json, math, os, struct, sys


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        fmt = {"F32": "f", "I32": "i"}[t["dtype"]]
        cnt = (b - a) // 4
        out[name] = (t["shape"], struct.unpack("<%d%s" % (cnt, fmt), data[a:b]))
    return out


def main():
    w = read_st(sys.argv[1])
    d = read_st(sys.argv[2])
    (din, hid), w1 = w["fc.weight"]
    _, b1 = w["fc.bias"]
    (_, k), w2 = w["head.weight"]
    _, b2 = w["head.bias"]
    (N, _), x = d["x"]
    _, y = d["y"]
    if len(sys.argv) > 3:
        N = int(sys.argv[3])
    total, right, rows = 0.0, 0, []
    for i in range(N):
        h = [max(0.0, b1[j] + sum(x[i * din + c] * w1[c * hid + j] for c in range(din)))
             for j in range(hid)]
        lg = [b2[o] + sum(h[j] * w2[j * k + o] for j in range(hid)) for o in range(k)]
        m = max(lg)
        lse = m + math.log(sum(math.exp(v - m) for v in lg))
        total += lse - lg[y[i]]
        right += lg.index(m) == y[i]
        rows.append(lg)
    print("%.12g %d %d" % (total / N, right, N))
    if os.environ.get("LOGITS"):
        with open(os.environ["LOGITS"], "w") as f:
            for r in rows:
                f.write(" ".join("%.9g" % v for v in r) + "\n")


main()
