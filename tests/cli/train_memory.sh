#!/bin/bash
# The final line's memory (issue 38): "peak mem R resident (training arena
# A, evaluation in the training arena, host copies 0 B)" on the CPU. R is
# the process's resident peak: at least the arena (every byte of it is
# touched), and at most the arena plus what the binary itself holds (its
# code, libraries and the compiled kernels, about 20 MiB), because the
# evaluation step runs in the arena's temporaries and params and optimizer
# state are not copied to the host. Before, the evaluation's own arena and
# the host copies came on top: 308 MiB resident for this 168 MiB arena.
# R is checked against the kernel's figure for the process (the maximum
# resident set of the child, from getrusage in python).
set -u
: "${KILN:?}"
command -v python3 > /dev/null || { echo "python3 not installed: skipped"; exit 77; }
python3 - "$KILN" <<'PY'
import re, resource, subprocess, sys
kiln = sys.argv[1]
cmd = [kiln, "train", "models/gpt.lua", "--set", "C=512", "--set", "L=2", "--set", "T=128",
       "--set", "batch=8", "--set", "eval_batches=1", "--steps", "1"]
p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
out = p.stdout
if p.returncode != 0:
    sys.exit("FAIL: kiln train exited %d:\n%s" % (p.returncode, out))
rss_kernel = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0  # MiB
line = [l for l in out.splitlines() if l.startswith("final:")]
if not line:
    sys.exit("FAIL: no final line:\n" + out)
m = re.search(r"\| peak mem ([0-9.]+) (KiB|MiB|GiB) resident \(training arena ([0-9.]+) "
              r"(KiB|MiB|GiB), evaluation (in the training arena|[0-9.]+ [KMG]iB), "
              r"host copies ([0-9.]+) (B|KiB|MiB|GiB)\)", line[0])
if not m:
    sys.exit("FAIL: the memory does not read as expected:\n" + line[0])
unit = {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
rss, arena = float(m[1]) * unit[m[2]], float(m[3]) * unit[m[4]]
host = float(m[6]) * unit[m[7]]
print("resident %.1f MiB (kernel: %.1f), arena %.1f MiB, evaluation %s, host copies %.1f MiB"
      % (rss, rss_kernel, arena, m[5], host))
if m[5] != "in the training arena":
    sys.exit("FAIL: the evaluation step has its own arena: " + m[5])
if host != 0:
    sys.exit("FAIL: host copies of params and state on the CPU: %.1f MiB" % host)
if not (arena > 100):
    sys.exit("FAIL: the arena (%.1f MiB) is too small for the check" % arena)
if not (arena <= rss <= arena + 48):
    sys.exit("FAIL: resident %.1f MiB is not within [arena, arena + 48 MiB] = [%.1f, %.1f]"
             % (rss, arena, arena + 48))
if abs(rss - rss_kernel) > 0.05 * rss_kernel + 2:
    sys.exit("FAIL: printed resident peak %.1f MiB, the kernel's %.1f MiB" % (rss, rss_kernel))
print("ok")
PY
