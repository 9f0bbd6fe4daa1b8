#!/usr/bin/env bash
# Conveyor's GPU checks, sized for one lease of a GPU machine: one H100 or H200, 15
# minutes of device time for the whole session (the machine's start included), at most
# 10 minutes per command, at most 8 files back from $OUT; the machine has the CUDA
# toolkit, CMake and ninja, none of Debian's -dev packages, and no network.
#
# WHAT TRAVELS, AND THE CALL
#   Here, on the Debian dev machine (no GPU needed; ~1.5 min on 2 cores):
#     tests/gpu/bundle_deps.sh            # .gpu_deps/: Abseil, GoogleTest, nlohmann-json,
#                                         #   nccl.h (~16 MiB)
#     tests/gpu/run.sh --build-only       # .gpu_build/: the GPU subset built for sm_90,
#                                         #   binaries packed (~2 MiB) + SOURCES
#   Both folders are git-ignored; the device tool carries them beside the tree (64 MiB
#   in all: the tree is ~18 MiB). Then one device call:
#     run(command="tests/gpu/run.sh", carry=[".gpu_deps", ".gpu_build"], timeout_s=540)
#   run.sh keeps to its own deadline (CONVEYOR_GPU_DEADLINE_S, default 420 s; not yet
#   timed on a GPU: the estimate is under a minute per test stage and 2-3 minutes for
#   the benchmark), so the command ends inside 540 s, and a first try (with the
#   machine's start, 1-2 min) leaves room for a second in the 15 minutes: rerun at once,
#   on the still-warm machine, with CONVEYOR_GPU_DEADLINE_S=240 and a GTEST_FILTER for
#   what needs another look. If the binaries in .gpu_build were built from other
#   sources than the tree's (SOURCES differs), or are missing, run.sh builds the subset
#   there from source (ninja -k 0: whatever builds, runs) with .gpu_deps.
#
# STAGES, in order of worth; each gets a timeout sized from the time left, and a stage
# that cannot fit its minimum is skipped and says so:
#   environment   toolchain and driver versions, and the libraries found (NCCL's too)
#   build         only without usable prebuilt binaries
#   kernels       tests/gpu/kernel_test.cc: every CUDA kernel against the CPU backend
#                 (L2 and worst-row max error), CUDA_LAUNCH_BLOCKING=1
#   quant         tests/gpu/quant_linear_test.cc: GGUF-block linear layers against
#                 ggml's dequantization (its graph-replay test without launch blocking)
#   sampler       tests/gpu/device_sampler_test.cc, CUDA_LAUNCH_BLOCKING=1
#   nccl          tests/gpu/nccl_test.cc: a group of one, the connect deadline, two
#                 ranks where there are two GPUs (skipped without NCCL)
#   agreement     tests/gpu/greedy_agreement_test.cc: CUDA bf16 against CPU fp32 on a
#                 random model, GGUF blocks, decode graphs (with a padded batch)
#   bench         bench/step_bench.cc, Llama-3-8B shape, batches 1-256 (logits checked
#                 finite), against the copy bandwidth and matrix rate it measures
#   memcheck      compute-sanitizer memcheck over the attention, RoPE and KV-write tests
# Every test binary's main() checks the device for faults after each test and names the
# test a fault surfaced after (tests/gpu/gpu_test_main.cc).
#
# Without a GPU (here, and in CI) every stage runs what it can and reports SKIPPED: the
# binaries load, the host-only tests pass, the GPU tests skip themselves; exit 0. On a
# machine with a GPU, a GPU test that skips (but for the ones that need two GPUs or
# NCCL) is a failure.
#
# Usage: tests/gpu/run.sh [--build-only] [GTEST_FILTER for the kernel tests]
# Environment:
#   CONVEYOR_GPU_DEPS        the dependency bundle (default <repo>/.gpu_deps)
#   CONVEYOR_GPU_PREBUILT    prebuilt binaries (default <repo>/.gpu_build)
#   CONVEYOR_GPU_BUILD       the build folder (default /tmp/conveyor-gpu-build)
#   CONVEYOR_GPU_JOBS        build parallelism (default: ninja's)
#   CONVEYOR_GPU_DEADLINE_S  the whole run's deadline in seconds (default 420)
#   OUT                      where the summary and logs go (default <build>/out); at
#                            most 8 files, 00-summary.txt first
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
build_only=0
if [[ "${1:-}" == --build-only ]]; then
  build_only=1
  shift
fi
filter=${1:-*}
deps=${CONVEYOR_GPU_DEPS:-$repo/.gpu_deps}
prebuilt=${CONVEYOR_GPU_PREBUILT:-$repo/.gpu_build}
build=${CONVEYOR_GPU_BUILD:-/tmp/conveyor-gpu-build}
out=${OUT:-$build/out}
deadline_s=${CONVEYOR_GPU_DEADLINE_S:-420}
start=$SECONDS
mkdir -p "$build" "$out" "$build/json"
summary="$out/00-summary.txt"
: >"$summary"

# The binaries, as paths in the build folder; the prebuilt folder holds them flat.
targets=(cuda_kernel_test cuda_quant_linear_test device_sampler_test nccl_test
  greedy_agreement_test conveyor-step-bench)
declare -A target_path=(
  [cuda_kernel_test]=kernels/cuda_kernel_test
  [cuda_quant_linear_test]=kernels/cuda_quant_linear_test
  [device_sampler_test]=device_sampler_test
  [nccl_test]=nccl_test
  [greedy_agreement_test]=greedy_agreement_test
  [conveyor-step-bench]=conveyor-step-bench
)

elapsed() { echo $((SECONDS - start)); }
left() { echo $((deadline_s - (SECONDS - start))); }
say() { printf '%s\n' "$*" | tee -a "$summary"; }
die() {
  echo "run.sh: $*" >&2
  exit 2
}

# A hash of every source the GPU subset compiles, so that binaries built elsewhere are
# used only for the tree they were built from.
source_hash() {
  (cd "$repo" && find kernels model checkpoint common testing tests/gpu bench/step_bench.cc \
    -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
    -o -name CMakeLists.txt \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum |
    cut -c1-16)
}

# ---- environment -------------------------------------------------------------------
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cuda_root=$(cd "$(dirname "$nvcc")/.." 2>/dev/null && pwd || echo /usr/local/cuda)
cuda_lib=$cuda_root/lib64
deps_lib=$deps/usr/lib/x86_64-linux-gnu
# The bundle's libraries load each other by soname, which the executables' RUNPATH does
# not reach: the loader path must.
export LD_LIBRARY_PATH="$deps_lib:$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# NCCL, loaded at run time by the tests that use it: the usual places, a bare
# libnccl.so.2 accepted, Python's nvidia-nccl wheels too (PyTorch's images have one).
find_nccl() {
  local candidates=("${CONVEYOR_NCCL_LIBRARY:-}" "${NCCL_HOME:+$NCCL_HOME/lib/libnccl.so.2}"
    "$cuda_lib/libnccl.so.2" /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/nccl/lib/libnccl.so.2)
  local from_ldconfig
  from_ldconfig=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
  candidates+=("$from_ldconfig")
  local python
  for python in python3 /opt/*/.venv/bin/python3; do
    command -v "$python" >/dev/null 2>&1 || continue
    candidates+=("$("$python" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)")
  done
  candidates+=(/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2
    /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2)
  local c
  for c in "${candidates[@]}"; do
    [[ -n "$c" && -f "$c" ]] && { echo "$c"; return; }
  done
}

gpu_count=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi

say "Conveyor GPU checks, $(date -u '+%Y-%m-%d %H:%M UTC'), deadline ${deadline_s} s"
say "---- environment"
say "host: $(uname -m), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
if ((gpu_count > 0)); then
  say "GPUs: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | paste -sd ';')"
else
  say "GPUs: none (nvidia-smi $(command -v nvidia-smi >/dev/null && echo lists none || echo not found))"
fi
say "nvcc: $([[ -x "$nvcc" ]] && "$nvcc" --version | tail -1 || echo 'not found')"
say "cmake: $(cmake --version 2>/dev/null | head -1 || echo 'not found'); ninja: $(ninja --version 2>/dev/null || echo 'not found'); c++: $(c++ --version 2>/dev/null | head -1 || echo 'not found')"
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  found=$(ls "$cuda_lib/$lib" 2>/dev/null || ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
  say "$lib: ${found:-NOT FOUND}"
done
nccl=$(find_nccl)
if [[ -n "$nccl" ]]; then
  export CONVEYOR_NCCL_LIBRARY=$nccl
  say "libnccl.so.2: $nccl"
else
  say "libnccl.so.2: NOT FOUND (the NCCL tests will report SKIPPED)"
fi
sanitizer=$(command -v compute-sanitizer || ls "$cuda_root"/bin/compute-sanitizer 2>/dev/null ||
  ls "$cuda_root"/compute-sanitizer/compute-sanitizer 2>/dev/null)
say "compute-sanitizer: ${sanitizer:-NOT FOUND}"
say "bundle: $([[ -d "$deps_lib" ]] && echo "$deps ($(du -sh "$deps" | cut -f1))" || echo "none at $deps")"

# ---- binaries: prebuilt, or built here ---------------------------------------------
declare -A binary=()
stage_rows=()  # "name|status|counts|seconds|note"
row() { stage_rows+=("$1|$2|$3|$4|$5"); }

build_subset() {  # $1: the time limit in seconds (0: none). Sets binary[...].
  local limit=$1 t0=$SECONDS
  local tmo=()
  ((limit > 0)) && tmo=(timeout -k 10 "$limit")
  local absl_dir="$deps_lib/cmake/absl" gtest_dir="$deps_lib/cmake/GTest"
  local json_dir="$deps/usr/share/cmake/nlohmann_json" nccl_include="$deps/nccl/include"
  if [[ ! -d "$absl_dir" || ! -d "$gtest_dir" || ! -d "$json_dir" ]]; then
    row build FAIL - 0 "no Abseil/GoogleTest/nlohmann-json bundle in $deps: run tests/gpu/bundle_deps.sh and carry .gpu_deps"
    return 1
  fi
  [[ -f "$nccl_include/nccl.h" ]] || nccl_include=""
  local log="$out/build.log"
  # A build folder configured from another tree (another checkout, an earlier copy of
  # this one) makes CMake refuse: start its configuration afresh.
  if [[ -f "$build/CMakeCache.txt" ]] &&
    ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$repo/tests/gpu" "$build/CMakeCache.txt"; then
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  fi
  # -include cstdint: Abseil 20220623's headers miss it, which GCC >= 13 no longer forgives.
  "${tmo[@]}" cmake -S "$repo/tests/gpu" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_CXX_FLAGS="-include cstdint" \
    -Dabsl_DIR="$absl_dir" -DGTest_DIR="$gtest_dir" -Dnlohmann_json_DIR="$json_dir" \
    ${nccl_include:+-DCONVEYOR_NCCL_INCLUDE_DIR="$nccl_include"} >"$log" 2>&1
  local rc=$?
  if ((rc != 0)); then
    tail -30 "$log"
    row build FAIL - $((SECONDS - t0)) "configure failed (rc $rc; build.log)"
    return 1
  fi
  local jobs=()
  [[ -n "${CONVEYOR_GPU_JOBS:-}" ]] && jobs=(-j "$CONVEYOR_GPU_JOBS")
  if ((limit > 0)); then
    limit=$((limit - (SECONDS - t0)))
    tmo=(timeout -k 10 "$limit")
  fi
  # No binary left from an earlier build may stand in for one that fails to build now
  # (relinking them costs seconds).
  for t in "${targets[@]}"; do rm -f "$build/${target_path[$t]}"; done
  "${tmo[@]}" ninja -C "$build" -k 0 "${jobs[@]}" "${targets[@]}" >>"$log" 2>&1
  rc=$?
  local built=0 missing=()
  for t in "${targets[@]}"; do
    if [[ -x "$build/${target_path[$t]}" ]]; then
      binary[$t]=$build/${target_path[$t]}
      built=$((built + 1))
    else
      missing+=("$t")
    fi
  done
  grep -E "error|FAILED:" "$log" | head -20
  echo "build: $(grep -c "warning:" "$log") compiler warnings (build.log)"
  local note="${built}/${#targets[@]} targets built"
  ((${#missing[@]} > 0)) && note+="; NOT BUILT: ${missing[*]}"
  ((rc == 124 || rc == 137)) && note+="; stopped at its ${limit} s limit"
  row build "$( ((${#missing[@]} == 0)) && echo PASS || echo FAIL)" - $((SECONDS - t0)) "$note"
  ((${#missing[@]} == 0))
}

if ((build_only)); then
  say "---- build (--build-only: into $build, then $prebuilt)"
  build_subset 0
  rc=$?
  # Packed: six binaries that each hold the same CUDA kernels compress ~15x with xz's
  # large window (32 MiB to ~2 MiB), which leaves room under the tool's 64 MiB.
  rm -rf "$prebuilt" "$build/pack"
  mkdir -p "$prebuilt" "$build/pack/bin"
  for t in "${!binary[@]}"; do
    cp "${binary[$t]}" "$build/pack/bin/$t"
    strip --strip-all "$build/pack/bin/$t" 2>/dev/null
  done
  tar -C "$build/pack" -cf - bin | xz -9 -T2 >"$prebuilt/bin.tar.xz"
  source_hash >"$prebuilt/SOURCES"
  cp "$out/build.log" "$prebuilt/build.log"
  exclude=$(git -C "$repo" rev-parse --git-path info/exclude 2>/dev/null)
  if [[ -n "$exclude" ]]; then
    [[ "$exclude" = /* ]] || exclude="$repo/$exclude"
    grep -qxF '/.gpu_build/' "$exclude" 2>/dev/null || echo '/.gpu_build/' >>"$exclude"
  fi
  IFS='|' read -r _ status _ seconds note <<<"${stage_rows[0]}"
  say "build: $status in ${seconds} s: $note"
  say "prebuilt: $prebuilt ($(du -sh "$prebuilt" | cut -f1)), sources $(cat "$prebuilt/SOURCES")"
  exit $rc
fi

# Unpacks the prebuilt binaries into $build/prebuilt/bin (tar's xz, else Python's).
unpack_prebuilt() {
  rm -rf "$build/prebuilt"
  mkdir -p "$build/prebuilt"
  tar -C "$build/prebuilt" -xJf "$prebuilt/bin.tar.xz" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$prebuilt/bin.tar.xz" "$build/prebuilt"
}

say "---- binaries"
if [[ -f "$prebuilt/bin.tar.xz" && -f "$prebuilt/SOURCES" ]] &&
  [[ "$(cat "$prebuilt/SOURCES")" == "$(source_hash)" ]] && unpack_prebuilt; then
  for t in "${targets[@]}"; do
    [[ -x "$build/prebuilt/bin/$t" ]] && binary[$t]=$build/prebuilt/bin/$t
  done
  say "prebuilt in $prebuilt (sources $(cat "$prebuilt/SOURCES")): ${#binary[@]}/${#targets[@]} binaries"
  row build PREBUILT - 0 "${#binary[@]}/${#targets[@]} binaries from $prebuilt"
  [[ -f "$prebuilt/build.log" ]] && cp "$prebuilt/build.log" "$out/build.log"
else
  if [[ -f "$prebuilt/bin.tar.xz" ]]; then
    say "prebuilt binaries in $prebuilt are from other sources ($(cat "$prebuilt/SOURCES" 2>/dev/null) vs $(source_hash)): building here"
  else
    say "no prebuilt binaries in $prebuilt: building here"
  fi
  # The build may take what the tests' minimums leave.
  build_subset $(($(left) - 150))
fi

# ---- test stages ---------------------------------------------------------------------
# run_stage NAME MIN_S MAX_S LOG KIND -- COMMAND...: runs COMMAND with a timeout of
# min(MAX_S, time left), unless less than MIN_S is left; KIND gtest or plain says how
# to read its output. Appends a row to the table.
run_stage() {
  local name=$1 min=$2 max=$3 log=$4 kind=$5
  shift 6
  local remaining
  remaining=$(left)
  if ((remaining < min)); then
    row "$name" SKIPPED - 0 "no time: ${remaining} s of the ${deadline_s} s deadline left, needs ${min} s"
    return
  fi
  local limit=$((max < remaining ? max : remaining)) t0=$SECONDS tmp
  tmp=$(mktemp)
  printf '\n==== %s (limit %d s, at %d s): %s\n' "$name" "$limit" "$(elapsed)" "$*" >>"$log"
  timeout -k 10 "$limit" "$@" >"$tmp" 2>&1
  local rc=$? seconds=$((SECONDS - t0))
  cat "$tmp" >>"$log"
  local status note=""
  if ((rc == 124 || rc == 137)); then
    status=TIMEOUT
    note="stopped at its ${limit} s limit"
  elif grep -q "error while loading shared libraries" "$tmp"; then
    status=FAIL
    note=$(grep -m1 "error while loading shared libraries" "$tmp")
  elif grep -q "^\[ DEVICE FAULT \]" "$tmp"; then
    status=FAIL
    note=$(grep -m1 "^\[ DEVICE FAULT \]" "$tmp" | cut -c1-160)
  fi
  local counts=-
  if [[ "$kind" == gtest ]]; then
    local pass fail skip gpu_skips
    pass=$(grep -cE '^\[       OK \] .* \([0-9]+ ms\)$' "$tmp")
    fail=$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$tmp")
    skip=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$tmp")
    counts="$pass/$fail/$skip"
    # Skips a GPU machine may show: no-device tests, two-GPU tests on one GPU, NCCL
    # tests without NCCL.
    gpu_skips=$(grep -E '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$tmp" |
      grep -vE 'WithoutDevice|TwoRanks' |
      { if [[ -n "$nccl" ]]; then cat; else grep -v 'NcclTest'; fi; } | grep -c .)
    if [[ -z "${status:-}" ]]; then
      if ((fail > 0 || rc != 0)); then
        status=FAIL
        note="rc $rc; $(grep -E '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$tmp" | head -3 |
          sed 's/^\[  FAILED  \] //' | paste -sd ';')"
      elif ((gpu_count == 0)); then
        status=SKIPPED
        note="no GPU: the binary ran, ${skip} GPU tests skipped themselves, ${pass} host-only passed"
      elif ((gpu_skips > 0)); then
        status=FAIL
        note="${gpu_skips} GPU tests skipped on a machine with a GPU (no usable CUDA device?)"
      else
        status=PASS
      fi
    fi
  elif [[ -z "${status:-}" ]]; then
    if ((rc == 0)); then
      status=PASS
    else
      status=FAIL
      note="rc $rc: $(tail -1 "$tmp" | cut -c1-160)"
    fi
  fi
  rm -f "$tmp"
  row "$name" "$status" "$counts" "$seconds" "$note"
}

# gtest_stage NAME MIN MAX LOG TARGET [ENV...] -- ARGS...
gtest_stage() {
  local name=$1 min=$2 max=$3 log=$4 target=$5
  shift 5
  local envs=()
  while [[ $# -gt 0 && "$1" != -- ]]; do
    envs+=("$1")
    shift
  done
  shift
  if [[ -z "${binary[$target]:-}" ]]; then
    row "$name" FAIL - 0 "$target was not built"
    return
  fi
  run_stage "$name" "$min" "$max" "$log" gtest -- env "${envs[@]}" "${binary[$target]}" \
    --gtest_output="json:$build/json/$name.json" "$@"
}

tests_log="$out/tests.log"
: >"$tests_log"
gtest_stage kernels 20 120 "$tests_log" cuda_kernel_test CUDA_LAUNCH_BLOCKING=1 -- \
  --gtest_filter="$filter"
gtest_stage quant 15 90 "$tests_log" cuda_quant_linear_test CUDA_LAUNCH_BLOCKING=1 -- \
  --gtest_filter='-*ReplaysInACudaGraph*'
# Stream capture and launch blocking do not mix: the graph test runs without it.
gtest_stage quant-graph 10 60 "$tests_log" cuda_quant_linear_test -- \
  --gtest_filter='*ReplaysInACudaGraph*'
gtest_stage sampler 15 90 "$tests_log" device_sampler_test CUDA_LAUNCH_BLOCKING=1 --
gtest_stage nccl 15 60 "$tests_log" nccl_test --
gtest_stage agreement 30 150 "$out/greedy_agreement.log" greedy_agreement_test --

if [[ -z "${binary[conveyor-step-bench]:-}" ]]; then
  row bench FAIL - 0 "conveyor-step-bench was not built"
elif ((gpu_count == 0)); then
  row bench SKIPPED - 0 "no GPU"
else
  # The bench stops starting new batches at its own limit, 60 s inside the stage's.
  bench_limit=$(($(left) < 200 ? $(left) : 200))
  ((bench_limit < 61)) && bench_limit=61  # Its own limit at least 1 s (0 means none).
  run_stage bench 60 200 "$out/step_bench.log" plain -- "${binary[conveyor-step-bench]}" \
    --backend=cuda --shape=llama3-8b --batches=1,8,64,256 --prompt_tokens=1024 \
    --time_limit_s=$((bench_limit - 60)) --json="$out/step_bench.json"
fi

if [[ -z "$sanitizer" ]]; then
  row memcheck SKIPPED - 0 "compute-sanitizer not found"
elif ((gpu_count == 0)); then
  row memcheck SKIPPED - 0 "no GPU"
elif [[ -z "${binary[cuda_kernel_test]:-}" ]]; then
  row memcheck FAIL - 0 "cuda_kernel_test was not built"
else
  run_stage memcheck 40 150 "$out/memcheck.log" plain -- "$sanitizer" --tool memcheck \
    --error-exitcode 9 --print-limit 20 "${binary[cuda_kernel_test]}" \
    --gtest_filter='*Attention*:*Rope*:*WriteKv*'
fi

# ---- summary -------------------------------------------------------------------------
{
  echo "---- checks (kernels, quant, nccl: [ METRIC ] lines)"
  awk '
    /^\[ METRIC/ {
      sub(/^\[ METRIC *\] */, "");
      rel = tol = row = rowtol = "-"; status = $NF;
      for (i = 3; i < NF; i++) {
        split($i, kv, "=");
        if (kv[1] == "rel_err") rel = kv[2]; else if (kv[1] == "tol") tol = kv[2];
        else if (kv[1] == "row_err") row = kv[2]; else if (kv[1] == "row_tol") rowtol = kv[2];
      }
      if ($3 !~ /=/ || rel == "-") { print; next }  # Free-form metrics: as printed.
      printf "%-44s %-5s %10s %8s %10s %8s  %s\n", $1, $2, rel, tol, row, rowtol, status;
      n++; if (status != "ok") bad++;
    }
    BEGIN { printf "%-44s %-5s %10s %8s %10s %8s\n", "check", "dtype", "rel_err", "tol", "row_err", "row_tol" }
    END { printf "%d checks, %d over tolerance\n", n, bad }
  ' "$tests_log" "$out/greedy_agreement.log" 2>/dev/null
  grep -hE "^first divergence|teacher-forced agreement|^\[ NCCL" "$tests_log" \
    "$out/greedy_agreement.log" 2>/dev/null
  if [[ -f "$out/step_bench.log" ]]; then
    echo "---- step benchmark"
    grep -E "^(phase|prefill|decode|model:|device|copy|matrix|\(time limit)" "$out/step_bench.log"
  fi
} >>"$summary"

failed=0
{
  echo "---- stages (tests passed/failed/skipped)"
  printf '%-12s %-9s %-9s %6s  %s\n' stage status tests seconds note
  for r in "${stage_rows[@]}"; do
    IFS='|' read -r name status counts seconds note <<<"$r"
    printf '%-12s %-9s %-9s %6s  %s\n' "$name" "$status" "$counts" "$seconds" "$note"
    [[ "$status" == FAIL || "$status" == TIMEOUT ]] && failed=1
  done
  files=$(find "$out" -maxdepth 1 -type f | wc -l)
  echo "total $(elapsed) s of the ${deadline_s} s deadline; ${files} files in $out"
  ((files > 8)) && echo "run.sh: more than 8 files in $out: the device tool returns only 8"
} >>"$summary"

# The table last on stdout (the device tool returns the output's tail).
grep -E "FAIL|over tolerance" "$summary" | grep -v "^---- \|^stage " | head -20
sed -n '/^---- stages/,$p' "$summary"
if ((failed)); then
  echo "run.sh: FAILED"
  exit 1
fi
if ((gpu_count == 0)); then
  echo "run.sh: no GPU: every GPU stage SKIPPED (nothing failed)"
else
  echo "run.sh: all GPU checks passed"
fi
