#!/usr/bin/env bash
# Conveyor replicas behind a router from PyPI (issue J, docs/scaling.md): installs
# `vllm-router` (or `sglang-router`) into a venv of its own and runs bench/router_bench.py:
# cache-aware against round-robin routing on a multi-tenant workload (prefix-cache hit rate,
# TTFT), then one replica killed and restarted mid-run.
#
# Usage: bench/run_router_bench.sh [--build-dir DIR] [--model-dir DIR] [--router vllm|sglang]
#        [-- ROUTER_BENCH_ARGS...]
# Environment: CONVEYOR_ROUTER_VENV (default /opt/conveyor-router-venv).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
model_dir="$repo/demo/model"
router=vllm
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --router) router="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$router" in
  vllm) binary=vllm-router ;;
  sglang) binary=sglang-router ;;
  *) echo "--router must be vllm or sglang" >&2; exit 2 ;;
esac
venv="${CONVEYOR_ROUTER_VENV:-/opt/conveyor-router-venv}"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
[ -x "$venv/bin/$binary" ] ||
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$repo/tests/router/requirements.txt"
ninja -C "$build_dir" conveyor-worker conveyor-scheduler >/dev/null
exec /usr/bin/python3 "$repo/bench/router_bench.py" --build-dir "$build_dir" \
  --model-dir "$model_dir" --router "$venv/bin/$binary" "$@"
