#!/usr/bin/env bash
# Where a step's time goes end to end: a worker and a scheduler on the `small` bf16 test
# model, conveyor-bench with 8 concurrent streams of 129-token prompts and 128 greedy
# outputs, and then from both metrics pages the scheduler's step time
# (conveyor_step_duration_seconds) against the worker's forward + sampling
# (conveyor_worker_step_compute_seconds): their difference per step is what the loop
# adds (planning, the Step round trip, streaming) that the worker does not overlap. Also
# the CPU seconds each process used while the load ran.
#
# Usage: bench/run_step_overhead_bench.sh [--build-dir DIR] [--model-dir DIR]
#        [--dtype bf16] [--threads N] [--steps-in-flight "1 2"] [--rounds N]
#        [--requests N] [--streams 8] [--input-len 129] [--output-len 128]
#        [--worker-flags "--backend=cuda ..."] [--sockets "tcp unix"]
#        [--schedulers "new=build/scheduler/conveyor-scheduler old=/tmp/old/conveyor-scheduler"]
# One stream on the demo model (the fixed cost of a step, issue P):
#   bench/run_step_overhead_bench.sh --model-dir demo/model --streams 1 --input-len 32 \
#     --output-len 512 --requests 6
# Each round runs every --schedulers binary (label=path; default: this build's), every
# --sockets transport between scheduler and worker (tcp: loopback; unix: the worker's
# --unix_socket) and every --steps-in-flight value (the scheduler's --max_steps_in_flight)
# in turn, so a machine whose speed drifts affects each alike.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
model_dir=""
dtype=bf16
threads="$(nproc)"
in_flight="1 2"
rounds=3
requests=24
worker_flags=""
streams=8
input_len=129
output_len=128
sockets=tcp
schedulers=""
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --steps-in-flight) in_flight="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --requests) requests="$2"; shift 2 ;;
    --worker-flags) worker_flags="$2"; shift 2 ;;
    --streams) streams="$2"; shift 2 ;;
    --input-len) input_len="$2"; shift 2 ;;
    --output-len) output_len="$2"; shift 2 ;;
    --sockets) sockets="$2"; shift 2 ;;
    --schedulers) schedulers="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
model_dir="${model_dir:-$build_dir/bench_models/small}"
schedulers="${schedulers:-this=$build_dir/scheduler/conveyor-scheduler}"
# shellcheck source=bench/small_model_server.sh
source "$repo/bench/small_model_server.sh"
# User + system CPU seconds of a process so far.
cpu_s() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$1/stat"; }
# The value of a metric (no labels filter: each page has one series of it).
metric() { curl -s "127.0.0.1:$1/metrics" | awk -v n="$2" '$1 ~ "^"n"({|$)" {print $2; exit}'; }
wait_metrics() { for _ in $(seq 100); do curl -s "127.0.0.1:$1/metrics" >/dev/null && return; sleep 0.1; done; }

echo "dtype $dtype, worker threads $threads, $requests requests, $streams streams, prompts $input_len, outputs $output_len"
echo "| round | scheduler | socket | steps in flight | output tok/s | ms/token | steps | step s | worker compute s | loop ms/step | CPU s worker / scheduler / client | CPU ms per output token |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for ((round = 1; round <= rounds; ++round)); do
for variant in $schedulers; do
for socket in $sockets; do
for k in $in_flight; do
  label="${variant%%=*}"; scheduler_bin="${variant#*=}"
  wport="$(free_port)"; sport="$(free_port)"; wmetrics="$(free_port)"; smetrics="$(free_port)"
  sock="$(mktemp -u /tmp/conveyor-bench-XXXXXX.sock)"
  if [[ "$socket" == unix ]]; then target="unix:$sock"; else target="127.0.0.1:$wport"; fi
  "$build_dir/worker/conveyor-worker" --port="$wport" --metrics_port="$wmetrics" \
    --unix_socket="$sock" --threads="$threads" --cpu_weight_dtype="$dtype" $worker_flags \
    2>/dev/null >/dev/null &
  worker=$!; pids+=("$worker")
  "$scheduler_bin" --model="$model_dir" --workers="$target" \
    --port="$sport" --metrics_port="$smetrics" --kv_cache_bytes=$((1 << 30)) \
    --max_steps_in_flight="$k" 2>/dev/null >/dev/null &
  scheduler=$!; pids+=("$scheduler")
  wait_metrics "$smetrics"; wait_metrics "$wmetrics"
  w0="$(cpu_s "$worker")"; s0="$(cpu_s "$scheduler")"
  out="$(mktemp)"; times="$(mktemp)"
  /usr/bin/time -f "%U %S" -o "$times" "$build_dir/bench/conveyor-bench" \
    --server="127.0.0.1:$sport" --workload=fixed --input_len="$input_len" \
    --output_len="$output_len" --concurrency="$streams" --num_requests="$requests" --quiet \
    --out="$out" >/dev/null 2>&1
  w1="$(cpu_s "$worker")"; s1="$(cpu_s "$scheduler")"
  /usr/bin/python3 - "$round $label $socket" "$k" "$out" "$times" "$w0" "$w1" "$s0" "$s1" "$((requests * output_len))" \
    "$(metric "$smetrics" conveyor_step_duration_seconds_count)" \
    "$(metric "$smetrics" conveyor_step_duration_seconds_sum)" \
    "$(metric "$wmetrics" conveyor_worker_step_compute_seconds_sum)" "$streams" <<'PY'
import json, sys
rnd, k, out, times, w0, w1, s0, s1, tokens, steps, step_s, compute_s, streams = sys.argv[1:]
streams = int(streams)  # ms/token: per stream.
rnd = " | ".join(rnd.split(" "))
tps = json.load(open(out))["summary"]["output_throughput"]
client = sum(float(v) for v in open(times).read().split())
steps, step_s, compute_s = int(float(steps)), float(step_s), float(compute_s)
loop_ms = (step_s - compute_s) / steps * 1000
cpu = [float(w1) - float(w0), float(s1) - float(s0), client]
per_token = " / ".join(f"{1000 * c / int(tokens):.3f}" for c in cpu)
print(f"| {rnd} | {k} | {tps:.1f} | {1000 * streams / tps:.3f} | {steps} | {step_s:.2f} | {compute_s:.2f} | {loop_ms:.2f} | "
      f"{cpu[0]:.2f} / {cpu[1]:.2f} / {cpu[2]:.2f} | {per_token} |")
PY
  rm -f "$out" "$times"
  cleanup; pids=(); rm -f "$sock"
done
done
done
done
