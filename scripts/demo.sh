#!/usr/bin/env bash
# Sets up Conveyor and serves the built-in demo model: installs packages, builds the
# scheduler, worker and CLI, generates the demo checkpoint (a random-weight ~88M
# parameter Llama, so its text is gibberish), starts one CPU worker and the scheduler,
# and streams a generation. The server keeps running until Ctrl-C (--once: stop after
# the generation).
#   scripts/demo.sh [--once] ["prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
once=0
if [ "${1:-}" = "--once" ]; then once=1; shift; fi
prompt="${1:-Once upon a time, in a server far away,}"
build="${BUILD_DIR:-build}"
model="${CONVEYOR_DEMO_MODEL:-models/demo}"

[ "${SKIP_INSTALL:-0}" = 1 ] || scripts/install-deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVEYOR_CUDA=OFF \
  -DCONVEYOR_BUILD_TESTS=OFF -DCONVEYOR_BUILD_BENCH=OFF >/dev/null
ninja -C "$build" -j "$(nproc)" conveyor-worker conveyor-scheduler conveyor-cli
if [ ! -f "$model/config.json" ]; then
  echo "generating the demo model in $model"
  /usr/bin/python3 tests/model_gen/make_test_model.py --preset small --out "$model"
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
"$build/worker/conveyor-worker" --port=50061 --metrics_port=9401 &
pids+=($!)
"$build/scheduler/conveyor-scheduler" --model="$model" --workers=127.0.0.1:50061 \
  --port=50051 --metrics_port=9400 --kv_cache_bytes=$((1 << 30)) &
pids+=($!)

echo "waiting for the server..."
for _ in $(seq 1 120); do
  if "$build/scheduler/conveyor-cli" --server=127.0.0.1:50051 --max_new_tokens=1 "ping" \
       >/dev/null 2>&1; then break; fi
  sleep 1
done
echo "prompt: $prompt"
"$build/scheduler/conveyor-cli" --server=127.0.0.1:50051 --max_new_tokens=64 \
  --temperature=0.8 --top_p=0.95 --seed=1 "$prompt"
if [ "$once" = 1 ]; then exit 0; fi
echo "serving on 127.0.0.1:50051 (metrics: http://127.0.0.1:9400/metrics); Ctrl-C stops"
echo "try: $build/scheduler/conveyor-cli --server=127.0.0.1:50051 \"your prompt\""
wait
