#!/usr/bin/env bash
# Three Conveyor replicas of the demo model behind the real routers from PyPI (issue J;
# docs/scaling.md): vllm-router, then sglang-router. Under each, cache_aware and
# round_robin on a multi-tenant workload (no request may fail, and cache-aware routing
# must raise the replicas' prefix-cache hit rate above round robin's), then one replica
# killed and restarted mid-run (every request ends, none fails while all replicas are up,
# the restarted one is routed to again). bench/router_bench.py does the work.
#
# Usage: tests/router/router_test.sh BUILD_DIR
# The routers come from the venv scripts/install-deps.sh makes ($CONVEYOR_ROUTER_VENV,
# default /opt/conveyor-router-venv); without them the test exits 77 (ctest: skipped).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${1:?usage: router_test.sh BUILD_DIR}"
venv="${CONVEYOR_ROUTER_VENV:-/opt/conveyor-router-venv}"
for router in vllm-router sglang-router; do
  if [ ! -x "$venv/bin/$router" ]; then
    echo "SKIP: $venv/bin/$router is missing (scripts/install-deps.sh installs it)"
    exit 77
  fi
done
logs="$build_dir/router-test-logs"
rm -rf "$logs"
status=0
for router in vllm-router sglang-router; do
  echo "== $router"
  /usr/bin/python3 "$repo/bench/router_bench.py" --build-dir "$build_dir" \
    --model-dir "$repo/demo/model" --router "$venv/bin/$router" \
    --policies cache_aware round_robin --log-dir "$logs/$router" || {
    status=1
    echo "FAIL $router (logs: $logs/$router)"
  }
done
exit "$status"
