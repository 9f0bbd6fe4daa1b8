#!/usr/bin/env bash
# Sets up Conveyor and serves the demo model: installs packages, builds the scheduler,
# worker and CLI, starts one CPU worker and the scheduler on demo/model (a 5.5M-parameter
# Llama that demo/train.py trained on the King James Bible, so it writes KJV-style
# English), and streams a sampled continuation of the prompt. The server keeps running
# until Ctrl-C (--once: stop after the generation). CONVEYOR_DEMO_MODEL serves another
# model directory instead.
#   scripts/demo.sh [--once] ["prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
once=0
if [ "${1:-}" = "--once" ]; then once=1; shift; fi
prompt="${1:-And the word of the LORD came unto me, saying,}"
build="${BUILD_DIR:-build}"
model="${CONVEYOR_DEMO_MODEL:-demo/model}"
if [ ! -f "$model/config.json" ]; then
  echo "no model in $model (config.json missing)" >&2
  exit 1
fi

[ "${SKIP_INSTALL:-0}" = 1 ] || scripts/install-deps.sh
# A fresh build directory gets the lean configuration; an existing one (say the tests')
# keeps its options: the demo only needs the three binaries below.
if [ -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" >/dev/null
else
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVEYOR_CUDA=OFF \
    -DCONVEYOR_BUILD_TESTS=OFF -DCONVEYOR_BUILD_BENCH=OFF >/dev/null
fi
ninja -C "$build" -j "$(nproc)" conveyor-worker conveyor-scheduler conveyor-cli

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
# The sampling settings of demo/model/generation_config.json: a little below temperature
# 1 and a nucleus cut keep a small model's text on track without making it repetitive.
"$build/scheduler/conveyor-cli" --server=127.0.0.1:50051 --max_new_tokens=80 \
  --temperature=0.7 --top_p=0.9 --seed=1 "$prompt"
if [ "$once" = 1 ]; then exit 0; fi
echo "serving on 127.0.0.1:50051 (metrics: http://127.0.0.1:9400/metrics); Ctrl-C stops"
echo "try: $build/scheduler/conveyor-cli --server=127.0.0.1:50051 \"your prompt\""
wait
