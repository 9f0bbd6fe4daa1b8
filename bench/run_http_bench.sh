#!/usr/bin/env bash
# Scheduler-process CPU per streamed token: gRPC Generate streams against the
# OpenAI-compatible HTTP API (SSE), on the same server, load and model. Starts one
# conveyor-worker and one conveyor-scheduler (--http_port) on the tiny test model, then
# alternates conveyor-bench runs over each API (closed loop, --concurrency streams) and
# reads the scheduler's utime+stime from /proc/<pid>/stat before and after each run,
# divided by the tokens the scheduler streamed in it (conveyor_generated_tokens_total).
# Only the scheduler's CPU is counted: the worker and the load generator share the
# machine but not the measure.
#
# Usage: bench/run_http_bench.sh [BUILD_DIR] [ROUNDS] [CONCURRENCY] [REQUESTS_PER_STREAM]
#   (defaults: build 2 64 4; builds nothing: run ninja for conveyor-worker,
#    conveyor-scheduler and conveyor-bench first). The scheduler runs CONCURRENCY
#    sequences per step (--max_num_seqs), so every stream is generating at once;
#    REQUESTS_PER_STREAM 1 makes each run CONCURRENCY simultaneous streams and no more.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:-$here/../build}" && pwd)"
rounds="${2:-2}"
concurrency="${3:-64}"
per_stream="${4:-4}"
model="$build/tests/testdata/llama3_gqa"
[ -d "$model" ] || "$here/../tests/make_test_data.sh" "$build/tests/testdata" >/dev/null
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  # Whatever has not exited after a few seconds is killed outright.
  for _ in $(seq 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Waits for "... listening on HOST:PORT" on the process's stdout file; prints PORT.
listening_port() {
  for _ in $(seq 600); do
    line="$(grep -m1 'listening on' "$1" 2>/dev/null || true)"
    if [ -n "$line" ]; then echo "${line##*:}"; return; fi
    sleep 0.1
  done
  echo "no 'listening on' line in $1" >&2; exit 1
}

"$build/worker/conveyor-worker" --port=0 --metrics_port=0 --threads=1 >"$tmp/worker.out" \
  2>"$tmp/worker.log" &
pids+=($!)
worker_port="$(listening_port "$tmp/worker.out")"
http_port="$(free_port)"
metrics_port="$(free_port)"
"$build/scheduler/conveyor-scheduler" --model="$model" --workers="127.0.0.1:$worker_port" \
  --port=0 --metrics_port="$metrics_port" --http_port="$http_port" --max_num_seqs="$concurrency" \
  --log_level=warn >"$tmp/scheduler.out" 2>"$tmp/scheduler.log" &
scheduler_pid=$!
pids+=("$scheduler_pid")
grpc_port="$(listening_port "$tmp/scheduler.out")"

ticks_per_s="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$scheduler_pid/stat"; }
streamed_tokens() {
  curl -s "127.0.0.1:$metrics_port/metrics" |
    awk '/^conveyor_generated_tokens_total/ {v = $2} END {print v}'
}

printf '%-5s %5s %10s %12s %14s %12s\n' api round tokens cpu_s us_per_token out_tok_per_s
for round in $(seq "$rounds"); do
  for api in grpc http; do
    cpu0="$(cpu_ticks)"
    tok0="$(streamed_tokens)"
    "$build/bench/conveyor-bench" --server="127.0.0.1:$grpc_port" --api="$api" \
      --http_server="127.0.0.1:$http_port" --workload=fixed --input_len=32 --output_len=256 \
      --num_requests=$((concurrency * per_stream)) --concurrency="$concurrency" --seed="$round" \
      --warmup_requests=1 --quiet --out="$tmp/$api-$round.json" >/dev/null 2>"$tmp/bench.log" ||
      { cat "$tmp/bench.log" >&2; exit 1; }
    cpu1="$(cpu_ticks)"
    tok1="$(streamed_tokens)"
    python3 - "$api" "$round" "$tok0" "$tok1" "$cpu0" "$cpu1" "$ticks_per_s" \
      "$tmp/$api-$round.json" <<'EOF'
import json, sys
api, rnd, tok0, tok1, cpu0, cpu1, hz, out = sys.argv[1:]
tokens = float(tok1) - float(tok0)
cpu_s = (float(cpu1) - float(cpu0)) / float(hz)
result = json.load(open(out))
failed = result["summary"]["failed_or_incomplete"]
tput = result["summary"]["output_throughput"]
print(f"{api:<5} {rnd:>5} {tokens:>10.0f} {cpu_s:>12.2f} {1e6 * cpu_s / tokens:>14.1f} "
      f"{tput:>12.0f}" + (f"  ({failed} failed)" if failed else ""))
EOF
  done
done
