#!/usr/bin/env bash
# Builds and runs Conveyor's GPU checks on a machine with an sm_90 GPU (H100/H200):
# a CUDA-only build (tests/gpu/CMakeLists.txt: kernels, the model without gRPC, the
# tests), then
#   1. the kernel tests against the CPU backend and the quantized linear layers against
#      ggml's dequantization, with a table of every check's error;
#   2. greedy decoding of the same random-weight model (tests/model_gen's `small` shape)
#      on CUDA bf16 and on the CPU in fp32: free-running first divergence per prompt,
#      teacher-forced agreement over 128 tokens (target >= 99 %), logit error;
#   3. the Llama-3-8B-shaped step benchmark (bench/step_bench.cc) at batch 1, 8, 64, 256,
#      prefill and decode against the copy bandwidth and bf16 matrix rate it measures.
#
# The GPU machine needs the CUDA toolkit (nvcc, cuBLAS), CMake >= 3.25, ninja and a host
# C++ compiler, and no network. Abseil, GoogleTest and nlohmann-json, which it lacks,
# come from a
# bundle made beforehand on a Debian dev machine:
#   tests/gpu/bundle_deps.sh          # writes .gpu_deps/ (~15 MiB, git-ignored)
# and carried with the call (device tool: carry [".gpu_deps"]).
#
# Usage: tests/gpu/run.sh [GTEST_FILTER]
# Environment:
#   CONVEYOR_GPU_DEPS   the bundle (default: <repo>/.gpu_deps)
#   CONVEYOR_GPU_BUILD  the build folder (default: /tmp/conveyor-gpu-build)
#   CONVEYOR_GPU_JOBS   build parallelism (default: ninja's)
#   OUT                 where logs and the gtest JSON go (default: the build folder)
#   CONVEYOR_BENCH_LIMIT_S  the step benchmark's time limit (default 180 s)
#
# Expected runtime on the 16-core H200 machine: configure ~15 s, build ~1.5 min (the
# attention kernels are the longest nvcc job, ~20 s of CPU), kernel tests < 1 min; under
# 3 min in all; the agreement test ~30 s; the step benchmark ~1-2 min (its random 8 G
# parameters are made on every core), and it skips what would run past its limit, so the
# whole script stays under the 8-minute budget.
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
deps=${CONVEYOR_GPU_DEPS:-$repo/.gpu_deps}
build=${CONVEYOR_GPU_BUILD:-/tmp/conveyor-gpu-build}
out=${OUT:-$build}
filter=${1:-*}
mkdir -p "$build" "$out"
start=$SECONDS

step() { printf '\n==== %s (%ds)\n' "$1" $((SECONDS - start)); }
die() {
  echo "run.sh: $*" >&2
  exit 2
}

step "environment"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x "$nvcc" ]] || die "nvcc not found (PATH or /usr/local/cuda/bin)"
command -v cmake >/dev/null || die "cmake not found"
command -v ninja >/dev/null || die "ninja not found"
absl_dir="$deps/usr/lib/x86_64-linux-gnu/cmake/absl"
gtest_dir="$deps/usr/lib/x86_64-linux-gnu/cmake/GTest"
json_dir="$deps/usr/share/cmake/nlohmann_json"
[[ -d "$absl_dir" && -d "$gtest_dir" && -d "$json_dir" ]] ||
  die "no Abseil/GoogleTest/nlohmann-json bundle in $deps: run tests/gpu/bundle_deps.sh and carry .gpu_deps"
# The bundle's libraries load each other by soname: the executable's RUNPATH does not
# reach those indirect dependencies, so the loader path must (also for the test
# discovery that runs the binary at build time).
cuda_lib=$(cd "$(dirname "$nvcc")/.." && pwd)/lib64
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu:$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$nvcc" --version | tail -1
cmake --version | head -1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "nvidia-smi: not available"

step "configure"
# -include cstdint: Abseil 20220623's headers miss it, which GCC >= 13 no longer forgives.
cmake -S "$repo/tests/gpu" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CXX_FLAGS="-include cstdint" \
  -Dabsl_DIR="$absl_dir" -DGTest_DIR="$gtest_dir" -Dnlohmann_json_DIR="$json_dir" \
  >"$out/configure.log" 2>&1 ||
  { tail -40 "$out/configure.log"; die "configure failed (log: $out/configure.log)"; }

step "build"
jobs=()
[[ -n "${CONVEYOR_GPU_JOBS:-}" ]] && jobs=(-j "$CONVEYOR_GPU_JOBS")
ninja -C "$build" "${jobs[@]}" cuda_kernel_test cuda_quant_linear_test device_sampler_test \
  greedy_agreement_test conveyor-step-bench \
  >"$out/build.log" 2>&1 ||
  { tail -60 "$out/build.log"; die "build failed (log: $out/build.log)"; }
grep -iE "warning" "$out/build.log" | head -20

step "kernel tests"
test_log="$out/kernel_test.log"
"$build/kernels/cuda_kernel_test" --gtest_filter="$filter" \
  --gtest_output="json:$out/kernel_test.json" >"$test_log" 2>&1
test_rc=$?
# The device sampler against the host sampler, and the quantized (GGUF block) linear
# layers against ggml's dequantization, into the same log and table.
"$build/device_sampler_test" --gtest_filter="$filter" \
  --gtest_output="json:$out/device_sampler_test.json" >>"$test_log" 2>&1 || test_rc=1
"$build/kernels/cuda_quant_linear_test" --gtest_filter="$filter" \
  --gtest_output="json:$out/quant_linear_test.json" >>"$test_log" 2>&1 || test_rc=1
grep -E "^\[  FAILED  \]|Failure|error:|last_error" "$test_log" | head -40

step "results"
# Checks: "[ METRIC   ] <check> <dtype> rel_err=<e> tol=<t> <ok|FAIL>".
awk '
  /^\[ METRIC/ {
    sub(/^\[ METRIC *\] */, "");
    split($3, e, "="); split($4, t, "=");
    printf "%-44s %-5s %11s %9s  %s\n", $1, $2, e[2], t[2], $5;
    n++; if ($5 != "ok") bad++;
  }
  BEGIN { printf "%-44s %-5s %11s %9s  %s\n", "check", "dtype", "rel_err", "tol", "" }
  END { printf "%d checks, %d over tolerance\n", n, bad }
' "$test_log"
echo
# Tests: one line each, with gtest's time.
awk '
  # Per-test lines end in "(N ms)"; the summary repeats names without it.
  function row(kind) { line = $0; sub(/^\[[^]]*\] /, "", line); printf "%-5s %s\n", kind, line }
  /^\[       OK \] .* \([0-9]+ ms\)$/ { row("PASS"); pass++ }
  /^\[  FAILED  \] .* \([0-9]+ ms\)$/ { row("FAIL"); fail++ }
  /^\[  SKIPPED \] .* \([0-9]+ ms\)$/ { row("SKIP"); skip++ }
  END { printf "kernel tests: %d passed, %d failed, %d skipped\n", pass, fail, skip }
' "$test_log"
# On a GPU machine only the no-device test may skip; anything else means the GPU was
# not usable, which must not read as a pass. CONVEYOR_GPU_ALLOW_SKIP=1 allows dry runs.
gpu_skips=$(grep -E "^\[  SKIPPED \] .* \([0-9]+ ms\)$" "$test_log" | grep -vc "WithoutDevice")
if ((gpu_skips > 0)) && [[ "${CONVEYOR_GPU_ALLOW_SKIP:-0}" != 1 ]]; then
  echo "run.sh: $gpu_skips GPU tests skipped: no usable CUDA device"
  test_rc=1
fi

step "greedy agreement: CUDA bf16 vs CPU fp32"
e2e_log="$out/greedy_agreement.log"
timeout 300 "$build/greedy_agreement_test" --gtest_output="json:$out/greedy_agreement.json" \
  >"$e2e_log" 2>&1
e2e_rc=$?
grep -E "^position|^first divergence|METRIC|teacher-forced|Failure|SKIPPED|OK \]|FAILED \]" \
  "$e2e_log" | head -60
if grep -qE "^\[  SKIPPED \] GreedyAgreementTest.Cuda" "$e2e_log" &&
  [[ "${CONVEYOR_GPU_ALLOW_SKIP:-0}" != 1 ]]; then
  echo "run.sh: the CUDA agreement test skipped: no usable CUDA device"
  e2e_rc=1
fi

step "step benchmark: Llama-3-8B shape, bf16, random weights"
timeout $((${CONVEYOR_BENCH_LIMIT_S:-180} + 120)) "$build/conveyor-step-bench" --backend=cuda \
  --shape=llama3-8b --batches=1,8,64,256 --prompt_tokens=1024 \
  --time_limit_s="${CONVEYOR_BENCH_LIMIT_S:-180}" --json="$out/step_bench.json" \
  2>&1 | tee "$out/step_bench.log"
bench_rc=${PIPESTATUS[0]}

step "done"
if ((test_rc != 0 || e2e_rc != 0 || bench_rc != 0)); then
  echo "run.sh: FAILED (kernel tests rc=$test_rc, e2e rc=$e2e_rc, bench rc=$bench_rc)"
  exit 1
fi
echo "run.sh: all GPU checks passed"
