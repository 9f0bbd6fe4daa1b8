#!/usr/bin/env bash
# Sets up, builds and runs every test that this machine can run (GPU tests report
# themselves skipped without a GPU).
#   scripts/run-tests.sh            install packages, build into ./build, run ctest
# Environment: SKIP_INSTALL=1 skips apt-get; CONVEYOR_CUDA=ON|OFF|AUTO (default AUTO:
# on when nvcc is found); BUILD_DIR (default ./build); JOBS (default: cores).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"
[ "${SKIP_INSTALL:-0}" = 1 ] || scripts/install-deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCONVEYOR_CUDA="${CONVEYOR_CUDA:-AUTO}" >/dev/null
ninja -C "$build" -j "$jobs"
cd "$build"
ctest --output-on-failure -j "$jobs" --timeout 600
