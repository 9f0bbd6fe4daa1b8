#!/usr/bin/env bash
# Mixture-of-experts decode against a dense model with the same active parameters, on the
# CPU backend (conveyor-step-bench: the worker's forward step and greedy sampling, no
# RPC): qwen3-moe-small (Qwen3-30B-A3B's routing, 128 experts of width 256, top 8, at the
# width and depth of `small`) against `small` (dense MLP of width 2048 = 8 x 256), random
# bf16 weights, decode of 1, 8 and 32 sequences at a context of PROMPT tokens. The two
# shapes alternate ROUNDS times so that both see the same machine; the ratio is the
# number that matters (docs/models.md).
# Usage: bench/run_moe_bench.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
build="${1:-build}"
out="${2:-bench/results/$(date +%F)-moe}"
rounds="${ROUNDS:-2}"
prompt="${PROMPT:-256}"
bench="$build/bench/conveyor-step-bench"
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for shape in small qwen3-moe-small; do
    "$bench" --backend=cpu --shape="$shape" --cpu_weights=bf16 --batches=1,8,32 \
      --prompt_tokens="$prompt" --max_step_tokens=2048 --decode_steps=16 \
      --json="$out/$shape-$round.json" > "$out/$shape-$round.log" 2>&1
  done
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def decode(shape, r):
    rows = json.load(open(f"{out}/{shape}-{r}.json"))["rows"]
    return {row["batch"]: row["seconds"] * 1e3 for row in rows if row["phase"] == "decode"}
print("| batch | dense ms/step | MoE ms/step | dense tok/s | MoE tok/s | MoE / dense |")
print("|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    d, m = decode("small", r), decode("qwen3-moe-small", r)
    for b in sorted(d):
        dms, mms = d[b], m[b]
        print(f"| {b} (round {r}) | {dms:.2f} | {mms:.2f} | {b / dms * 1e3:.0f} | "
              f"{b / mms * 1e3:.0f} | {dms / mms:.2f} |")
PY
