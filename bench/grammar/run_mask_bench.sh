#!/usr/bin/env bash
# Token mask speed, ours beside xgrammar's, on the same grammars, 128k vocabulary and token
# walks (issue T): builds mask_bench, runs it, runs xgrammar_mask_bench.py with the xgrammar
# venv (tests/grammar_ref/requirements.txt; $CONVEYOR_XGRAMMAR_VENV, else
# /opt/conveyor-xgrammar-venv) and prints one table. Times in microseconds.
#
#   bench/grammar/run_mask_bench.sh [BUILD_DIR] [SENTENCES]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
sentences="${2:-20}"
venv="${CONVEYOR_XGRAMMAR_VENV:-/opt/conveyor-xgrammar-venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "no xgrammar venv at $venv: see tests/grammar_ref/requirements.txt" >&2
  exit 1
fi
ninja -C "$build" mask_bench >&2
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$build/bench/mask_bench" --out "$dir" --sentences "$sentences" > "$dir/ours.jsonl"
"$venv/bin/python" "$root/bench/grammar/xgrammar_mask_bench.py" "$dir" > "$dir/theirs.jsonl"
python3 - "$dir/ours.jsonl" "$dir/theirs.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for path in sys.argv[1:] for l in open(path) if l.strip()]
cols = ["mask_cold_median_us", "mask_cold_p99_us", "mask_warm_median_us", "mask_warm_p99_us",
        "mask_warm_max_us", "compile_cold_us", "compile_again_median_us"]
heads = ["schema", "engine", "masks"] + [c.replace("_us", "") for c in cols]
print("| " + " | ".join(heads) + " |")
print("|" + "---|" * len(heads))
for r in sorted(rows, key=lambda r: (r["schema"] != "simple", r["engine"])):
    print("| " + " | ".join([r["schema"], r["engine"], str(r["masks"])] +
                            [f"{r[c]:.1f}" for c in cols]) + " |")
PY
