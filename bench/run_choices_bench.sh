#!/usr/bin/env bash
# n choices against n separate requests (issue N): a worker and a scheduler serve a model
# (the demo model by default) with --http_port; bench/choices_bench.py sends one request
# with n choices, then n requests of the same prompt at once, and reports for each the
# peak of conveyor_kv_blocks_used (polled while they run), the wall time and the output
# tokens per second; once with prefix caching on (separate requests then share what the
# first one computed before the others were admitted) and once off (only the n choices
# share).
#
# Usage: bench/run_choices_bench.sh [--build-dir DIR] [--model-dir DIR] [--threads N]
#        [--n "4 8"] [--prompt-tokens N] [--max-tokens N] [--rounds N]
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
model_dir="$repo/demo/model"
threads="$(nproc)"
ns="4 8"
prompt_tokens=256
max_tokens=192
rounds=2
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --n) ns="$2"; shift 2 ;;
    --prompt-tokens) prompt_tokens="$2"; shift 2 ;;
    --max-tokens) max_tokens="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/small_model_server.sh
source "$repo/bench/small_model_server.sh"
for caching in true false; do
  echo "--enable_prefix_caching=$caching"
  wport="$(free_port)"; sport="$(free_port)"; hport="$(free_port)"; mport="$(free_port)"
  "$build_dir/worker/conveyor-worker" --port="$wport" --metrics_port=0 --threads="$threads" \
    >/dev/null 2>&1 &
  pids+=("$!")
  "$build_dir/scheduler/conveyor-scheduler" --model="$model_dir" --workers="127.0.0.1:$wport" \
    --port="$sport" --http_port="$hport" --metrics_port="$mport" --kv_cache_bytes=$((1 << 30)) \
    --max_num_seqs=64 --enable_prefix_caching="$caching" >/dev/null 2>&1 &
  pids+=("$!")
  /usr/bin/python3 "$repo/bench/choices_bench.py" --http "127.0.0.1:$hport" \
    --metrics "127.0.0.1:$mport" --n $ns --prompt-tokens "$prompt_tokens" \
    --max-tokens "$max_tokens" --rounds "$rounds"
  cleanup
  pids=()
done
