#!/usr/bin/env bash
# Builds scheduler_bench (and conveyor-worker), makes the tiny test model if it is missing,
# optionally measures the `small` model's batch-64 decode step with run_worker_bench.sh,
# and runs the scheduler benchmark (see bench/scheduler_bench.cc for what it measures).
#
# Usage: bench/run_scheduler_bench.sh [script options] [scheduler_bench options]
#   --build-dir DIR       configured CMake build directory (default: $BUILD_DIR or build)
#   --model-dir DIR       the tiny model; generated there if missing
#                         (default: <build dir>/bench_models/tiny)
#   --small-step-ms X     the small model's decode b=64 ms/step, for the overhead line;
#                         without it the script runs bench/run_worker_bench.sh --quick
#                         to measure it (minutes), unless --no-worker-bench is given
#   --no-worker-bench     do not run the worker benchmark (no percentage is printed)
#   --small-model-dir DIR the small model for run_worker_bench.sh (default: its own,
#                         <build dir>/bench_models/small, generated if missing)
#   --jobs N              build parallelism (default: 1)
# scheduler_bench options: --quick, --steps N, --rpc_steps N, --worker_threads N,
#   --no_rpc, --no_metrics, --benchmark_filter=REGEX and other Google Benchmark flags.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
model_dir=""
small_step_ms=""
small_model_args=()
worker_bench=1
jobs=1
bench_args=()
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --small-step-ms) small_step_ms="$2"; shift 2 ;;
    --small-step-ms=*) small_step_ms="${1#*=}"; shift ;;
    --no-worker-bench) worker_bench=0; shift ;;
    --small-model-dir) small_model_args=(--model-dir "$2"); shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
model_dir="${model_dir:-$build_dir/bench_models/tiny}"

if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "no CMake build in $build_dir; configure one first, e.g." >&2
  echo "  cmake -S $repo -B $build_dir -G Ninja -DCONVEYOR_CUDA=OFF" >&2
  exit 1
fi
cmake --build "$build_dir" --target scheduler_bench conveyor-worker -- -j"$jobs"

if [[ ! -f "$model_dir/config.json" ]]; then
  echo "generating the tiny model in $model_dir"
  # Debian's python3, which has numpy (the pyenv python3 on PATH may not).
  /usr/bin/python3 "$repo/tests/model_gen/make_test_model.py" --preset tiny --out "$model_dir"
fi

if [[ -z "$small_step_ms" && "$worker_bench" == 1 ]]; then
  echo "measuring the small model's batch-64 decode step (bench/run_worker_bench.sh --quick)"
  log="$(mktemp)"
  if "$repo/bench/run_worker_bench.sh" --build-dir "$build_dir" "${small_model_args[@]}" \
       --quick | tee "$log"; then
    # The row "  decode b=64   <tokens> <ctx> <ms/step> <tok/s> ...".
    small_step_ms="$(awk '$1 == "decode" && $2 == "b=64" { print $5; exit }' "$log")"
  fi
  rm -f "$log"
  if [[ -z "$small_step_ms" ]]; then
    echo "could not read decode b=64 ms/step from the worker benchmark; no percentage" >&2
  fi
fi

args=(--model="$model_dir")
[[ -n "$small_step_ms" ]] && args+=(--small_step_ms="$small_step_ms")
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
"$build_dir/bench/scheduler_bench" "${args[@]}" "${bench_args[@]}"
