#!/usr/bin/env bash
# End-to-end output tokens/s of the CPU worker with f32, bf16 and int8 weights
# (--cpu_weight_dtype), one after the other in the same run on the same load: a worker and
# a scheduler on the `small` bf16 test model, and conveyor-bench with 8 concurrent
# streams of 129-token prompts and 128 greedy output tokens each.
#
# Usage: bench/run_weight_dtype_bench.sh [--build-dir DIR] [--model-dir DIR]
#        [--dtypes "f32 bf16 int8"] [--requests N] [--threads N] [--rounds N]
#        [--steps-in-flight "0"]
# Prints one line per dtype and round, and a table of ratios to f32. With --rounds N the
# dtypes run in turn N times (f32 bf16 int8 f32 bf16 int8 ...), so a machine whose speed
# drifts affects each alike; the table then gives each dtype's median and the median of
# the per-round ratios. --steps-in-flight "1 2" runs each dtype with each of the
# scheduler's --max_steps_in_flight in the same round, and adds their ratio (0, the
# default, lets the scheduler choose: 1 with CPU workers).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
model_dir=""
dtypes="f32 bf16 int8"
requests=32
threads="$(nproc)"
rounds=1
in_flight="0"
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --dtypes) dtypes="$2"; shift 2 ;;
    --requests) requests="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --steps-in-flight) in_flight="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
model_dir="${model_dir:-$build_dir/bench_models/small}"
# shellcheck source=bench/small_model_server.sh
source "$repo/bench/small_model_server.sh"

declare -A tps  # "dtype/in-flight" -> space-separated tok/s, one per round
for ((round = 1; round <= rounds; ++round)); do
for dtype in $dtypes; do
for k in $in_flight; do
  wport="$(free_port)"; sport="$(free_port)"
  "$build_dir/worker/conveyor-worker" --port="$wport" --metrics_port=0 --threads="$threads" \
    --cpu_weight_dtype="$dtype" 2>"/tmp/conveyor-dtype-worker-$dtype.log" >/dev/null &
  pids+=($!)
  "$build_dir/scheduler/conveyor-scheduler" --model="$model_dir" --workers="127.0.0.1:$wport" \
    --port="$sport" --metrics_port=0 --kv_cache_bytes=$((1 << 30)) \
    --max_steps_in_flight="$k" 2>/dev/null >/dev/null &
  pids+=($!)
  out="$(mktemp)"
  "$build_dir/bench/conveyor-bench" --server="127.0.0.1:$sport" --workload=fixed \
    --input_len=129 --output_len=128 --concurrency=8 --num_requests="$requests" \
    --quiet --out="$out" >/dev/null
  t="$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["output_throughput"])' "$out")"
  tps[$dtype/$k]="${tps[$dtype/$k]:-} $t"
  backend="$(grep -o 'CPU backend [^ ]* [^(]*(.*)' "/tmp/conveyor-dtype-worker-$dtype.log" | head -1 || true)"
  echo "round $round, $dtype, --max_steps_in_flight=$k: $t output tok/s ($backend)"
  rm -f "$out"
  cleanup; pids=()
done
done
done
ratio_table() {  # NAME TOKS BASE_TOKS: median tok/s and the median of per-round ratios
  /usr/bin/python3 -c '
import statistics, sys
t = [float(v) for v in sys.argv[2].split()]
b = [float(v) for v in sys.argv[3].split()] if sys.argv[3].strip() else t
print(f"| {sys.argv[1]} | {statistics.median(t):.1f} | {statistics.median(x / y for x, y in zip(t, b)):.2f}x |")' \
    "$1" "$2" "$3"
}
for k in $in_flight; do
  echo
  echo "--max_steps_in_flight=$k:"
  echo "| weights | output tok/s (median of $rounds) | vs f32 (median of per-round ratios) |"
  echo "| --- | --- | --- |"
  for dtype in $dtypes; do ratio_table "$dtype" "${tps[$dtype/$k]}" "${tps[f32/$k]:-}"; done
done
first="${in_flight%% *}"
if [[ "$in_flight" != "$first" ]]; then
  for k in ${in_flight#* }; do
    echo
    echo "--max_steps_in_flight=$k against $first:"
    echo "| weights | output tok/s (median of $rounds) | vs $first (median of per-round ratios) |"
    echo "| --- | --- | --- |"
    for dtype in $dtypes; do ratio_table "$dtype" "${tps[$dtype/$k]}" "${tps[$dtype/$first]}"; done
  done
fi
