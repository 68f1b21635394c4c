#!/usr/bin/env python3
"""kernel_table.py PREDICTED MEASURED - the per-kernel table of a GPU run:
every launch name of the step, predicted (kiln compile --target DEV
--kernel-table) against measured (kiln train --profile --kernel-table), per
step, sorted by measured time, with the totals of each kind. Both files are
kiln's per-kernel table (docs/cost.md); rows join on their name (a
generated kernel's name, gemm_op<N> for the GEMM of IR op N, copy). A name
in one file only is listed with '-' on the other side. Exit 1, naming the
file and line, when a file is not a kernel table."""
import sys

COLS = ["kind", "name", "shape", "calls", "ms", "flops", "bytes", "op", "where"]


def read(path):
    meta, rows = {}, {}
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    except OSError as e:
        sys.exit(f"kernel_table.py: {path}: {e.strerror}")
    if not lines or lines[0] != "# kiln kernel table 1":
        sys.exit(f"kernel_table.py: {path}:1: not a kiln kernel table (expected "
                 f"'# kiln kernel table 1', got {lines[0][:40]!r})")
    header = False
    for i, ln in enumerate(lines[1:], start=2):
        if not ln:
            continue
        f = ln.split("\t")
        if ln.startswith("#"):
            if len(f) >= 2:
                meta[f[0][1:].strip()] = f[1]
            continue
        if not header:
            if f != COLS:
                sys.exit(f"kernel_table.py: {path}:{i}: expected the header "
                         f"{' '.join(COLS)!r}, got {ln[:80]!r}")
            header = True
            continue
        if len(f) != len(COLS):
            sys.exit(f"kernel_table.py: {path}:{i}: expected {len(COLS)} tab-separated "
                     f"fields, got {len(f)}")
        r = dict(zip(COLS, f))
        try:
            for k in ("calls", "ms", "flops", "bytes"):
                r[k] = float(r[k])
        except ValueError:
            sys.exit(f"kernel_table.py: {path}:{i}: a number expected in calls, ms, "
                     f"flops, bytes, got {ln[:80]!r}")
        rows[r["name"]] = r
    if not header:
        sys.exit(f"kernel_table.py: {path}: no header line (a cut file?)")
    return meta, rows


def fmt(x):
    return "-" if x is None else f"{x:.4f}"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: kernel_table.py PREDICTED MEASURED")
    pm, pred = read(sys.argv[1])
    mm, meas = read(sys.argv[2])
    names = list(meas) + [n for n in pred if n not in meas]
    names.sort(key=lambda n: -(meas[n]["ms"] if n in meas else -1))
    print(f"per-kernel table, ms per step: predicted on {pm.get('device', '?')} "
          f"(step {pm.get('step_ms', '?')} ms) vs measured on {mm.get('device', '?')} "
          f"over {mm.get('steps', '?')} steps (median step {mm.get('step_ms', '?')} ms)")
    print(f"{'kind':6} {'name':34} {'shape':22} {'calls':>5} {'predicted':>10} "
          f"{'measured':>10} {'meas/pred':>9}  where")
    tot = {}
    for n in names:
        p, m = pred.get(n), meas.get(n)
        r = m or p
        pms = p["ms"] if p else None
        mms = m["ms"] if m else None
        ratio = f"{mms / pms:9.2f}" if p and m and pms > 0 else f"{'-':>9}"
        t = tot.setdefault(r["kind"], [0.0, 0.0, 0])
        t[0] += pms or 0
        t[1] += mms or 0
        t[2] += 1
        print(f"{r['kind']:6} {n[:34]:34} {r['shape'][:22]:22} {r['calls']:5.0f} "
              f"{fmt(pms):>10} {fmt(mms):>10} {ratio}  {r['op']} {r['where']}")
    print("totals by kind:")
    ap = am = 0.0
    for k, (a, b, c) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
        ap, am = ap + a, am + b
        ratio = f"{b / a:.2f}" if a > 0 else "-"
        print(f"  {k:7} {c:4d} names  predicted {a:10.4f} ms  measured {b:10.4f} ms  "
              f"meas/pred {ratio}")
    ratio = f"{am / ap:.2f}" if ap > 0 else "-"
    print(f"total: predicted {ap:.4f} ms, measured {am:.4f} ms in launches (meas/pred {ratio}); "
          f"{len(names)} names, {len(pred)} predicted, {len(meas)} measured")


if __name__ == "__main__":
    main()
