#!/usr/bin/env bash
# Structured output end to end: what constraining every request costs. One worker and one
# scheduler on the `small` bf16 test model; conveyor-bench with CONCURRENCY closed-loop
# streams of 32-token prompts and 128 sampled output tokens, alternating runs with no
# constraint and with every request constrained to one of two JSON Schemas whose
# sentences are longer than 128 tokens (so every request generates exactly 128 tokens,
# as the free run's ignore_eos does):
#   string:  one long string (the matcher inside a string: most tokens allowed)
#   objects: an array of at least 100 objects with typed fields (structure: keys,
#            numbers, enums, nested arrays)
# Prints output tokens/s and TTFT p50 per run, and the ratio to the free run of its round.
# Each run draws its own prompts (its own seed), so none finds another's in the prefix cache.
#
# Usage: bench/run_structured_bench.sh [--build-dir DIR] [--model-dir DIR] [--rounds N]
#        [--concurrency N] [--threads N]
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
model_dir=""
rounds=3
concurrency=64
threads="$(nproc)"
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
model_dir="${model_dir:-$build_dir/bench_models/small}"
# shellcheck source=bench/small_model_server.sh
source "$repo/bench/small_model_server.sh"
wait_metrics() { for _ in $(seq 300); do curl -s "127.0.0.1:$1/metrics" >/dev/null && return; sleep 0.1; done; }

string_schema='{"type": "string", "minLength": 1000}'
objects_schema='{"type": "array", "minItems": 100, "items": {"type": "object", "properties": {
  "id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12},
  "score": {"type": "number"}, "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
  "maxItems": 3}, "ok": {"type": "boolean"}}, "required": ["id", "name", "score", "tags", "ok"],
  "additionalProperties": false}}'

wport="$(free_port)"; sport="$(free_port)"; smetrics="$(free_port)"
"$build_dir/worker/conveyor-worker" --port="$wport" --metrics_port=0 --threads="$threads" \
  --cpu_weight_dtype=bf16 >/dev/null 2>&1 &
pids+=($!)
"$build_dir/scheduler/conveyor-scheduler" --model="$model_dir" --workers="127.0.0.1:$wport" \
  --port="$sport" --metrics_port="$smetrics" --max_num_seqs="$concurrency" \
  --kv_cache_bytes=$((1 << 30)) --log_level=warn >/dev/null 2>&1 &
pids+=($!)
wait_metrics "$smetrics"

echo "small model, $concurrency streams, 32-token prompts, 128 sampled tokens (temperature 1)"
echo "| round | constraint | output tok/s | vs free | TTFT p50 ms | TTFT p90 ms | output tokens |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
tmp="$(mktemp -d)"
for ((round = 1; round <= rounds; ++round)); do
  k=0
  for kind in none string objects; do
    k=$((k + 1))
    schema=""
    [[ "$kind" == string ]] && schema="$string_schema"
    [[ "$kind" == objects ]] && schema="$objects_schema"
    out="$tmp/$kind-$round.json"
    "$build_dir/bench/conveyor-bench" --server="127.0.0.1:$sport" --workload=fixed \
      --input_len=32 --output_len=128 --temperature=1 --concurrency="$concurrency" \
      --num_requests=$((concurrency * 2)) --seed=$((round * 10 + k)) --warmup_requests=2 \
      --json_schema="$schema" --quiet --out="$out" >/dev/null 2>"$tmp/bench.log" ||
      { cat "$tmp/bench.log" >&2; exit 1; }
    /usr/bin/python3 - "$round" "$kind" "$out" "$tmp/free-$round" <<'PY'
import json, os, sys
rnd, kind, out, free_file = sys.argv[1:]
s = json.load(open(out))["summary"]
tps = s["output_throughput"]
if kind == "none":
    open(free_file, "w").write(str(tps))
ratio = f"{tps / float(open(free_file).read()):.3f}" if os.path.exists(free_file) else ""
print(f"| {rnd} | {kind} | {tps:.1f} | {ratio} | {s['ttft_ms']['p50']:.1f} | "
      f"{s['ttft_ms']['p90']:.1f} | {s['output_tokens']} |")
PY
  done
done
rm -rf "$tmp"
