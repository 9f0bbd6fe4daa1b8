#!/usr/bin/env bash
# Speculative decoding end to end: a worker and a scheduler serve a model with
# --speculative_method off, ngram, suffix and draft (with --draft-model) in turn
# (interleaved, round by round), and
# conveyor-bench runs a closed loop of greedy requests at each concurrency. Per run:
# output tok/s, steps, and from the scheduler's metrics the drafts proposed and kept and
# the mean accepted length. By default random-id prompts (conveyor-bench's); with
# --prompts-file, token-id prompts from bench/make_grounded_prompts.py: `grounded` (a
# passage the answer copies) or `free` (text to continue, nothing to copy).
#
# Usage: bench/run_speculative_bench.sh [--build-dir DIR] [--model-dir DIR] [--threads N]
#        [--concurrency "1 8 32"] [--methods "off ngram suffix"] [--rounds N]
#        [--requests-per-client N] [--input-len N] [--output-len N] [--prompts-file F]
#        [--draft-model DIR] [--num-speculative-tokens K]
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
model_dir="$repo/demo/model"
threads="$(nproc)"
concurrency="1 8 32"
methods="off ngram suffix"
rounds=2
per_client=2
input_len=128
output_len=128
prompts_file=""
draft_model=""
num_spec=4
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --methods) methods="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --requests-per-client) per_client="$2"; shift 2 ;;
    --input-len) input_len="$2"; shift 2 ;;
    --output-len) output_len="$2"; shift 2 ;;
    --prompts-file) prompts_file="$2"; shift 2 ;;
    --draft-model) draft_model="$2"; shift 2 ;;
    --num-speculative-tokens) num_spec="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ " $methods " == *" draft "* && -z $draft_model ]]; then
  echo "--methods draft needs --draft-model DIR" >&2; exit 2
fi
# shellcheck source=bench/small_model_server.sh
source "$repo/bench/small_model_server.sh"
metric() { curl -s "127.0.0.1:$1/metrics" | awk -v n="$2" '$1 ~ "^"n"({|$)" {print $2; exit}'; }
wait_metrics() { for _ in $(seq 100); do curl -s "127.0.0.1:$1/metrics" >/dev/null && return; sleep 0.1; done; }

echo "model $model_dir, worker threads $threads, prompts ${prompts_file:-random ids of $input_len}, outputs $output_len (greedy)"
echo "| round | streams | method | output tok/s | steps | drafts | kept | kept per verification |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for ((round = 1; round <= rounds; ++round)); do
for c in $concurrency; do
for method in $methods; do
  wport="$(free_port)"; sport="$(free_port)"; smetrics="$(free_port)"
  draft_args=()
  [[ $method == draft ]] && draft_args=(--speculative_model="$draft_model")
  "$build_dir/worker/conveyor-worker" --port="$wport" --metrics_port=0 \
    --threads="$threads" 2>/dev/null >/dev/null &
  pids+=("$!")
  "$build_dir/scheduler/conveyor-scheduler" --model="$model_dir" --workers="127.0.0.1:$wport" \
    --port="$sport" --metrics_port="$smetrics" --kv_cache_bytes=$((1 << 30)) \
    --max_num_seqs=64 --speculative_method="$method" --num_speculative_tokens="$num_spec" \
    "${draft_args[@]}" 2>/dev/null >/dev/null &
  pids+=("$!")
  wait_metrics "$smetrics"
  out="$(mktemp)"
  "$build_dir/bench/conveyor-bench" --server="127.0.0.1:$sport" --workload=fixed \
    --input_len="$input_len" --output_len="$output_len" --concurrency="$c" \
    --num_requests=$((c * per_client)) ${prompts_file:+--prompts_file="$prompts_file"} \
    --quiet --out="$out" >/dev/null 2>&1
  /usr/bin/python3 - "$round" "$c" "$method" "$out" \
    "$(metric "$smetrics" conveyor_step_duration_seconds_count)" \
    "$(metric "$smetrics" conveyor_spec_draft_tokens_total)" \
    "$(metric "$smetrics" conveyor_spec_accepted_tokens_total)" \
    "$(metric "$smetrics" conveyor_spec_verifications_total)" <<'PY'
import json, sys
rnd, c, method, out, steps, drafts, kept, verifications = sys.argv[1:]
tps = json.load(open(out))["summary"]["output_throughput"]
num = lambda v: float(v) if v else 0.0
steps, drafts, kept, verifications = num(steps), num(drafts), num(kept), num(verifications)
per = f"{kept / verifications:.2f}" if verifications else "-"
print(f"| {rnd} | {c} | {method} | {tps:.1f} | {steps:.0f} | {drafts:.0f} | {kept:.0f} | {per} |")
PY
  rm -f "$out"
  cleanup; pids=()
done
done
done
