#!/bin/bash
# Renders a kiln report page in headless Chromium and saves a screenshot:
#
#   tests/report/screenshot.sh REPORT.html OUT.png [WIDTHxHEIGHT]
#
# Exits 77 (skipped) when Chromium is not installed (Debian's `chromium`).
# The page loads nothing from the network, so the render is the page alone.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT]" >&2; exit 2; }
page=$(realpath "$1")
out=$2
size=${3:-900x2600}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "Chromium not installed: no screenshot"; exit 77; }
profile=$(mktemp -d "${TMPDIR:-/tmp}/kiln-chromium-XXXXXX")
trap 'rm -rf "$profile"' EXIT
# --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$profile" --window-size="${size/x/,}" \
    --screenshot="$(realpath -m "$out")" "file://$page" > "$profile/log" 2>&1 ||
    { cat "$profile/log" >&2; exit 1; }
[ -s "$out" ] || { echo "no screenshot written" >&2; cat "$profile/log" >&2; exit 1; }
echo "screenshot: $out"
