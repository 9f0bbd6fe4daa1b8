#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang, ASan and UBSan in build-fuzz/,
# then runs each for SECONDS (default 60) on a copy of its committed seed corpus
# (tests/fuzz/corpus/<target>/; what libFuzzer adds stays in the copy). Prints one line
# per target (execs, exec/s, result) and exits non-zero on any crash, leak, sanitizer
# report, timeout, out-of-memory or broken invariant. Findings are saved under
# build-fuzz/fuzz-artifacts/<target>/; reproduce one with
#   build-fuzz/tests/fuzz/<target> build-fuzz/fuzz-artifacts/<target>/crash-...
# Usage: scripts/run-fuzz.sh [SECONDS] [TARGET...]
# Environment: CONVEYOR_FUZZ_BUILD (build dir), JOBS (build jobs, 2), CONVEYOR_FUZZ_SEED
# (libFuzzer's -seed: the same mutations each run, as CI uses; unset: a new seed each run),
# CONVEYOR_BUILD_LOCK (a file the build holds with flock, so builds sharing a machine
# take turns; default /tmp/conveyor-build.lock, "" for none).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(generate_request_fuzzer step_request_fuzzer safetensors_fuzzer
                                     model_config_fuzzer gguf_fuzzer detokenizer_fuzzer
                                     http_request_fuzzer tool_call_parser_fuzzer)
build="${CONVEYOR_FUZZ_BUILD:-$root/build-fuzz}"
lock="${CONVEYOR_BUILD_LOCK-/tmp/conveyor-build.lock}"
locked=()
if [ -n "$lock" ] && command -v flock >/dev/null; then locked=(flock "$lock"); fi

start=$SECONDS
# -O1 keeps the build short and the stacks readable; no NDEBUG, so asserts hold too.
"${locked[@]}" env CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCONVEYOR_FUZZ=ON \
  -DCONVEYOR_CUDA=OFF -DCONVEYOR_BUILD_TESTS=OFF -DCONVEYOR_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" >/dev/null
"${locked[@]}" ninja -C "$build" -j"${JOBS:-2}" fuzzers
echo "run-fuzz: built in $((SECONDS - start)) s"

# UBSan aborts on the first report (the build has -fno-sanitize-recover=all); LSan runs
# at exit of each libFuzzer run.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=0
summary=()
for target in "${targets[@]}"; do
  bin="$build/tests/fuzz/$target"
  artifacts="$build/fuzz-artifacts/$target"
  work="$(mktemp -d)"
  mkdir -p "$artifacts"
  cp -r "$root/tests/fuzz/corpus/$target" "$work/corpus"
  args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=4096
        -artifact_prefix="$artifacts/")
  [ -f "$root/tests/fuzz/dict/$target.dict" ] && args+=(-dict="$root/tests/fuzz/dict/$target.dict")
  [ -n "${CONVEYOR_FUZZ_SEED:-}" ] && args+=(-seed="$CONVEYOR_FUZZ_SEED")
  log="$artifacts/fuzz.log"
  rc=0
  "$bin" "${args[@]}" "$work/corpus" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    result="ok"
  else
    failed=1
    kind=$(grep -m1 -oE 'fuzz invariant violated: .*|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer): [a-z-]+|runtime error: .*' "$log" || true)
    found=$(ls -t "$artifacts" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | head -1 || true)
    result="FAILED (exit $rc): ${kind:-see $log}${found:+; input: $artifacts/$found}"
  fi
  rm -rf "$work"
  line=$(printf '%-24s %12s execs %8s exec/s  %s' "$target" "${execs:-?}" "${rate:-?}" "$result")
  echo "$line"
  summary+=("$line")
done
echo "run-fuzz: ${#targets[@]} targets, ${seconds} s each, $((SECONDS - start)) s in all"
printf '%s\n' "${summary[@]}"
exit "$failed"
