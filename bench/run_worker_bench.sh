#!/usr/bin/env bash
# Builds worker_bench, makes the `small` test model if it is missing, and runs the CPU
# worker benchmark on it (see bench/worker_bench.cc for what it measures).
#
# Usage: bench/run_worker_bench.sh [script options] [worker_bench options]
#   --build-dir DIR          configured CMake build directory (default: $BUILD_DIR or build)
#   --model-dir DIR          the small model; generated there if missing
#                            (default: <build dir>/bench_models/small)
#   --native-openblas        unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for this run, so
#                            OpenBLAS picks its kernel from the CPU (0.3.21 falls back to
#                            Prescott on CPUs newer than it knows)
#   --openblas-coretype NAME run OpenBLAS's NAME kernel (e.g. SkylakeX) for this run
# worker_bench options: --threads N (default: all cores), --quick (fewer repetitions),
#   --weight_dtype f32|bf16|int8, --kv_dtype auto|f32|bf16.
#
# The OpenBLAS settings change only the sgemm ceiling: the worker computes with its own
# GEMM. Whatever ran, the benchmark prints the OpenBLAS kernel it used.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
model_dir=""
openblas_mode="inherit"
coretype=""
bench_args=()
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --native-openblas) openblas_mode="native"; shift ;;
    --openblas-coretype) openblas_mode="coretype"; coretype="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
model_dir="${model_dir:-$build_dir/bench_models/small}"

if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "no CMake build in $build_dir; configure one first, e.g." >&2
  echo "  cmake -S $repo -B $build_dir -G Ninja -DCONVEYOR_BUILD_TESTS=OFF" >&2
  exit 1
fi
cmake --build "$build_dir" --target worker_bench

if [[ ! -f "$model_dir/config.json" ]]; then
  echo "generating the small model in $model_dir"
  # Debian's python3, which has numpy (the pyenv python3 on PATH may not).
  /usr/bin/python3 "$repo/tests/model_gen/make_test_model.py" --preset small --out "$model_dir"
fi

bench=("$build_dir/bench/worker_bench" --model "$model_dir" "${bench_args[@]}")
case "$openblas_mode" in
  inherit)
    echo "OpenBLAS environment as inherited: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}"
    "${bench[@]}" ;;
  native)
    echo "OpenBLAS environment: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (autodetect)"
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${bench[@]}" ;;
  coretype)
    echo "OpenBLAS environment: OPENBLAS_CORETYPE=$coretype, OPENBLAS_L2_SIZE unset"
    env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE="$coretype" "${bench[@]}" ;;
esac
