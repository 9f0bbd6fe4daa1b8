#!/usr/bin/env bash
# Offline tests for deploy/: the Helm chart, the Grafana dashboard, the Prometheus example
# and the Docker helper. Needs Debian's golang-go, golang-github-masterminds-sprig-dev,
# golang-gopkg-yaml.v2-dev, yamllint and python3-yaml (scripts/install-deps.sh); uses
# promtool and shellcheck when installed, and Helm's own engine when helm-python-sdk is
# available (see --install-helm-sdk; python3-venv).
#
# Usage: deploy/tests/run_chart_tests.sh [--metrics-file FILE]... [--workdir DIR]
#                                        [--install-helm-sdk] [--require-helm]
#   --metrics-file FILE  check the dashboard against a Prometheus text scrape (repeatable,
#                        e.g. a scheduler's and a worker's /metrics) instead of docs/metrics.md
#   --workdir DIR        where the renderer is built and the manifests are written
#                        (default: build/deploy-tests; nothing is written to the source tree)
#   --install-helm-sdk   pip-install helm-python-sdk (Helm v4's engine, no helm binary) into
#                        DIR/helm-sdk first; needs the network once, later runs are offline
#   --require-helm       fail instead of skipping the real-Helm checks when it is missing
# HELM_SDK_PYTHON=/path/to/python selects an interpreter that already has helm-python-sdk.
# CONVEYOR_ROUTER_VENV (default /opt/conveyor-router-venv, as bench/run_router_bench.sh
# makes it) holds vllm-router and sglang-router: the routers' own argument parsers then
# check every router argument the chart renders (skipped when it is missing).
#
# Every check prints PASS, FAIL or SKIP; the last line is "N passed, M failed".
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEPLOY="$REPO/deploy"
CHART="$DEPLOY/helm/conveyor"
TESTS="$DEPLOY/tests"
PY=/usr/bin/python3   # Debian's Python: it sees python3-yaml (the PATH one may not)
HELM_SDK_VERSION=0.2.2

WORK="$REPO/build/deploy-tests"
METRICS_FILES=()
INSTALL_HELM=0
REQUIRE_HELM=0
while [ $# -gt 0 ]; do
  case "$1" in
    --metrics-file) METRICS_FILES+=("$(realpath "$2")"); shift 2 ;;
    --metrics-file=*) METRICS_FILES+=("$(realpath "${1#*=}")"); shift ;;
    --workdir) WORK=$2; shift 2 ;;
    --workdir=*) WORK=${1#*=}; shift ;;
    --install-helm-sdk) INSTALL_HELM=1; shift ;;
    --require-helm) REQUIRE_HELM=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
OUT="$WORK/out"
LOGS="$WORK/logs"
rm -rf "$OUT" "$LOGS"
mkdir -p "$OUT/go" "$OUT/helm" "$LOGS" "$WORK/bin"

PASSED=0
FAILED=0
SKIPPED=0

# check NAME COMMAND...: runs the command, logs its output, counts and prints the result.
check() {
  local name=$1; shift
  local log
  log="$LOGS/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_').log"
  if "$@" >"$log" 2>&1; then
    PASSED=$((PASSED + 1)); echo "PASS $name"
  else
    FAILED=$((FAILED + 1)); echo "FAIL $name"
    tail -n 40 "$log" | sed 's/^/    /'
  fi
}
skip() { SKIPPED=$((SKIPPED + 1)); echo "SKIP $1: $2"; }

# ---- Tools ---------------------------------------------------------------------------------
tools_ok=1
for tool in go yamllint; do
  command -v "$tool" >/dev/null || { echo "missing $tool (run scripts/install-deps.sh)"; tools_ok=0; }
done
"$PY" -c 'import yaml' 2>/dev/null || { echo "missing python3-yaml for $PY"; tools_ok=0; }
for pkg in github.com/Masterminds/sprig gopkg.in/yaml.v2; do
  [ -d "/usr/share/gocode/src/$pkg" ] || { echo "missing Go package $pkg (Debian -dev package)"; tools_ok=0; }
done
check "tools installed" test "$tools_ok" = 1

# ---- Renderers -----------------------------------------------------------------------------
RENDER="$WORK/bin/render"
build_renderer() {
  GO111MODULE=off GOFLAGS='' GOPATH="$WORK/gopath:/usr/share/gocode" GOCACHE="$WORK/gocache" \
    nice go build -p 1 -o "$RENDER" "$TESTS/render/main.go"
}
check "build Go stand-in renderer (text/template + sprig)" build_renderer

HELM_PY=""
find_helm_sdk() {
  local candidate
  for candidate in "${HELM_SDK_PYTHON:-}" "$WORK/helm-sdk/bin/python"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] &&
       "$candidate" -c 'import helm_python, yaml' >/dev/null 2>&1; then
      HELM_PY=$candidate
      return 0
    fi
  done
  return 1
}
install_helm_sdk() {
  # --system-site-packages: the venv sees Debian's python3-yaml.
  "$PY" -m venv --system-site-packages "$WORK/helm-sdk" &&
    "$WORK/helm-sdk/bin/pip" install --quiet --disable-pip-version-check \
      --require-hashes -r "$TESTS/helm-sdk-requirements.txt"
}
if ! find_helm_sdk && [ "$INSTALL_HELM" = 1 ]; then
  check "install helm-python-sdk $HELM_SDK_VERSION" install_helm_sdk
  find_helm_sdk
fi
if [ -n "$HELM_PY" ]; then
  version=$("$HELM_PY" -c 'import helm_python as h; print(h.__version__, "(Helm", h.helm_sdk_version() + ")")')
  echo "INFO real Helm engine: helm-python-sdk $version via $HELM_PY"
elif [ "$REQUIRE_HELM" = 1 ]; then
  check "helm-python-sdk available (--require-helm)" false
else
  echo "INFO real Helm engine not installed (run with --install-helm-sdk once); using the Go stand-in only"
fi

# render_go CASE RELEASE NAMESPACE [VALUES]: manifests and NOTES with the stand-in.
render_go() {
  local case=$1 release=$2 ns=$3; shift 3
  local args=(); for v in "$@"; do args+=(-f "$v"); done
  "$RENDER" -chart "$CHART" "${args[@]}" -name "$release" -namespace "$ns" -o "$OUT/go/$case.yaml" &&
    "$RENDER" -chart "$CHART" "${args[@]}" -name "$release" -namespace "$ns" -notes \
      -o "$OUT/go/$case.NOTES.txt" &&
    test -s "$OUT/go/$case.NOTES.txt" && test -s "$OUT/go/$case.yaml"
}
render_helm() {
  local case=$1 release=$2 ns=$3; shift 3
  local args=(); for v in "$@"; do args+=(-f "$v"); done
  "$HELM_PY" "$TESTS/helm_sdk.py" render "$CHART" "${args[@]}" --name "$release" --namespace "$ns" \
    -o "$OUT/helm/$case.yaml"
}
# same_manifests A B: byte-identical, or at least the same objects once parsed. Each render
# makes a new random scheduler id (the identity Secret; check_manifests.py checks its form),
# so Secret data that is base64 of 32 characters is masked in both first.
same_manifests() {
  "$PY" - "$1" "$2" <<'EOF'
import base64, binascii, difflib, sys, yaml
texts, docs = [], []
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    objs = [d for d in yaml.safe_load_all(text) if d]
    for obj in objs:
        data = obj.get("data") if obj.get("kind") == "Secret" else None
        for key, value in (data or {}).items():
            try:
                random_id = len(base64.b64decode(str(value), validate=True)) == 32
            except binascii.Error:
                random_id = False
            if random_id:
                text = text.replace(f"  {key}: {value}\n", f"  {key}: <random id>\n")
                data[key] = "<random id>"
    texts.append(text)
    docs.append(sorted(yaml.safe_dump(d, sort_keys=True) for d in objs))
if texts[0] == texts[1]:
    sys.exit(0)
diff = difflib.unified_diff(texts[0].splitlines(True), texts[1].splitlines(True), *sys.argv[1:])
sys.stdout.writelines(list(diff)[:40])
sys.exit(0 if docs[0] == docs[1] else 1)
EOF
}

# ---- Chart: one case per values file -------------------------------------------------------
# case name | release | namespace | overlay (relative to the repo)
CASES=(
  "default|conveyor|llm|"
  "tp2|prod|inference|deploy/helm/values-tp2.yaml"
  "cpu|conveyor|default|deploy/helm/values-cpu.yaml"
  "toggles|x|ns|deploy/tests/values/toggles.yaml"
  "secured|sec|prod|deploy/tests/values/secured.yaml"
  "secured-min|conveyor|edge|deploy/tests/values/secured-min.yaml"
  "replicas|llama|llm|deploy/tests/values/replicas.yaml"
  "sglang-router|conveyor|serving|deploy/tests/values/sglang-router.yaml"
  "inference-pool|pool|gateway-test|deploy/tests/values/inference-pool.yaml"
)
for spec in "${CASES[@]}"; do
  IFS='|' read -r case release ns overlay <<<"$spec"
  values=(); [ -n "$overlay" ] && values=("$REPO/$overlay")
  fargs=(); for v in "${values[@]}"; do fargs+=(-f "$v"); done
  if ! check "render[$case] Go stand-in" render_go "$case" "$release" "$ns" "${values[@]}"; then
    continue
  fi
  manifest="$OUT/go/$case.yaml"
  check "yamllint[$case] rendered manifests" yamllint -s -c "$TESTS/yamllint.yaml" "$manifest"
  check "manifests[$case] kinds, ports, probes, GPUs, ranks, policies, grace, TLS/tokens, groups, routing" \
    "$PY" "$TESTS/check_manifests.py" "$manifest" --chart "$CHART" "${fargs[@]}" --namespace "$ns"
  check "self-test[$case] manifest checker catches broken manifests" \
    "$PY" "$TESTS/self_test.py" manifests "$manifest" --chart "$CHART" "${fargs[@]}" --namespace "$ns"
  if [ -n "$HELM_PY" ]; then
    if check "render[$case] real Helm" render_helm "$case" "$release" "$ns" "${values[@]}"; then
      check "render[$case] Go stand-in == real Helm" same_manifests "$OUT/helm/$case.yaml" "$manifest"
    fi
    check "helm lint --strict[$case]" "$HELM_PY" "$TESTS/helm_sdk.py" lint "$CHART" "${fargs[@]}" --strict
  fi
done

# ---- The scheduler's identity: random per install, kept by helm upgrade ---------------------
# scheduler_id FILE: the data of the identity Secret in a rendering.
scheduler_id() {
  "$PY" -c 'import sys, yaml
print([d["data"] for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Secret"])' "$1"
}
# new_id_per_install RENDERER: two fresh renders (lookup finds nothing) hold different ids.
new_id_per_install() {
  local a b
  if [ "$1" = go ]; then
    "$RENDER" -chart "$CHART" -o "$WORK/id-a.yaml" && "$RENDER" -chart "$CHART" -o "$WORK/id-b.yaml"
  else
    "$HELM_PY" "$TESTS/helm_sdk.py" render "$CHART" -o "$WORK/id-a.yaml" &&
      "$HELM_PY" "$TESTS/helm_sdk.py" render "$CHART" -o "$WORK/id-b.yaml"
  fi || return 1
  a=$(scheduler_id "$WORK/id-a.yaml") && b=$(scheduler_id "$WORK/id-b.yaml") || return 1
  echo "$a"; echo "$b"
  [ "$a" != "[]" ] && [ "$a" != "$b" ]
}
# An upgrade: lookup finds the Secret of the earlier install (tests/cluster/), whose id the
# rendered Secret must keep (the stand-in's -lookup; Helm's engine offline has no cluster).
id_kept_on_upgrade() {
  "$RENDER" -chart "$CHART" -name conveyor -namespace llm \
    -lookup "$TESTS/cluster/existing-scheduler-id.yaml" -o "$OUT/go/upgrade.yaml" &&
    "$PY" "$TESTS/check_manifests.py" "$OUT/go/upgrade.yaml" --chart "$CHART" --namespace llm \
      --lookup "$TESTS/cluster/existing-scheduler-id.yaml"
}
check "identity: each install generates its own scheduler id (Go stand-in)" new_id_per_install go
[ -n "$HELM_PY" ] && check "identity: each install generates its own scheduler id (real Helm)" \
  new_id_per_install helm
check "identity: helm upgrade keeps the scheduler id lookup finds (Go stand-in)" id_kept_on_upgrade
# Several groups: each keeps its own id (tests/cluster/existing-group-ids.yaml).
group_ids_kept_on_upgrade() {
  "$RENDER" -chart "$CHART" -f "$TESTS/values/replicas.yaml" -name llama -namespace llm \
    -lookup "$TESTS/cluster/existing-group-ids.yaml" -o "$OUT/go/upgrade-groups.yaml" &&
    "$PY" "$TESTS/check_manifests.py" "$OUT/go/upgrade-groups.yaml" --chart "$CHART" \
      -f "$TESTS/values/replicas.yaml" --namespace llm --lookup "$TESTS/cluster/existing-group-ids.yaml"
}
check "identity: helm upgrade keeps each replica group's id (Go stand-in)" group_ids_kept_on_upgrade

# Values the chart must refuse, each with the message it must give (first line: "# expect: ...").
expect_render_failure() {
  local renderer=$1 file=$2 expected
  expected=$(sed -n 's/^# expect: //p' "$file" | head -n 1)
  local out
  if [ "$renderer" = go ]; then
    out=$("$RENDER" -chart "$CHART" -f "$file" 2>&1 >/dev/null) && { echo "rendered without error"; return 1; }
  else
    out=$("$HELM_PY" "$TESTS/helm_sdk.py" render "$CHART" -f "$file" 2>&1 >/dev/null) &&
      { echo "rendered without error"; return 1; }
  fi
  printf '%s\n' "$out"
  grep -qF -- "$expected" <<<"$out" || { echo "expected the message: $expected"; return 1; }
}
for bad in "$TESTS"/values/bad/*.yaml; do
  check "refuses $(basename "$bad" .yaml) (Go stand-in)" expect_render_failure go "$bad"
  [ -n "$HELM_PY" ] && check "refuses $(basename "$bad" .yaml) (real Helm)" expect_render_failure helm "$bad"
done

# ---- YAML sources --------------------------------------------------------------------------
check "yamllint chart values, examples, Prometheus and kind configs" \
  yamllint -s -c "$TESTS/yamllint.yaml" "$CHART/Chart.yaml" "$CHART/values.yaml" \
  "$DEPLOY"/helm/values-*.yaml "$DEPLOY/prometheus/scrape-example.yaml" "$DEPLOY/kind/cluster.yaml" \
  "$TESTS/yamllint.yaml" "$TESTS"/values/*.yaml "$TESTS"/values/bad/*.yaml "$TESTS"/cluster/*.yaml

# ---- Prometheus scrape example -------------------------------------------------------------
promtool_config() {
  # Debian's Prometheus is built without Kubernetes discovery; if promtool rejects
  # kubernetes_sd_configs for that reason alone, check everything else with a static stand-in.
  local cfg="$DEPLOY/prometheus/scrape-example.yaml" out
  if out=$(promtool check config "$cfg" 2>&1); then echo "$out"; return 0; fi
  echo "$out"
  grep -q 'field kubernetes_sd_configs not found' <<<"$out" || return 1
  echo "(this promtool lacks Kubernetes service discovery; checking the rest)"
  "$PY" - "$cfg" "$WORK/scrape-no-k8s-sd.yaml" <<'EOF' && promtool check config "$WORK/scrape-no-k8s-sd.yaml"
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
for job in cfg["scrape_configs"]:
    for sd in job.pop("kubernetes_sd_configs", []):
        assert sd["role"] in ("endpoints", "endpointslice", "pod", "service"), sd
        job.setdefault("static_configs", []).append({"targets": ["k8s-sd.invalid:9400"]})
yaml.safe_dump(cfg, open(sys.argv[2], "w"))
EOF
}
if command -v promtool >/dev/null; then
  check "promtool check config prometheus/scrape-example.yaml" promtool_config
else
  skip "promtool check config" "promtool not installed (Debian package prometheus)"
fi

# ---- Grafana dashboard ---------------------------------------------------------------------
DASHBOARD="$DEPLOY/grafana/conveyor-dashboard.json"
dashboard_current() {
  "$PY" "$DEPLOY/grafana/gen_dashboard.py" >"$WORK/dashboard.json" &&
    diff -u "$DASHBOARD" "$WORK/dashboard.json"
}
check "dashboard JSON is what gen_dashboard.py generates" dashboard_current
metric_args=(--metrics-doc "$REPO/docs/metrics.md")
if [ ${#METRICS_FILES[@]} -gt 0 ]; then
  for f in "${METRICS_FILES[@]}"; do metric_args+=(--metrics-file "$f"); done
  source_desc="scrape ${METRICS_FILES[*]}"
else
  source_desc="docs/metrics.md"
fi
check "dashboard: JSON, variables, every conveyor_* metric and label exported ($source_desc)" \
  "$PY" "$TESTS/check_dashboard.py" "$DASHBOARD" "${metric_args[@]}" \
  --promql-rules "$WORK/dashboard-rules.yaml"
grep -h '^note:' "$LOGS"/dashboard_*.log 2>/dev/null | sort -u | sed 's/^/    /'
check "self-test dashboard checker catches broken dashboards" \
  "$PY" "$TESTS/self_test.py" dashboard "$DASHBOARD" --metrics-doc "$REPO/docs/metrics.md"
if command -v promtool >/dev/null && [ -s "$WORK/dashboard-rules.yaml" ]; then
  check "promtool parses every dashboard PromQL expression" \
    promtool check rules "$WORK/dashboard-rules.yaml"
else
  skip "promtool PromQL parse" "promtool not installed (Debian package prometheus)"
fi

# ---- The chart's flags against the binaries -------------------------------------------------
# An unknown flag stops a process, so the newest locally built scheduler and worker must
# accept every argument the chart gives them (absl: --version exits 0 only if they parse).
newest_binary() {
  find "$REPO"/build* -maxdepth 3 -type f -name "$1" -perm -u+x -printf '%T@ %p\n' 2>/dev/null |
    sort -rn | head -n 1 | cut -d' ' -f2-
}
# accepts_chart_flags BINARY KIND MANIFEST...: KIND is Deployment or StatefulSet.
accepts_chart_flags() {
  local binary=$1 kind=$2 manifest flags; shift 2
  for manifest in "$@"; do
    [ -s "$manifest" ] || continue
    # The first scheduler Deployment / worker StatefulSet (every group's take the same flags).
    mapfile -t flags < <("$PY" -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    labels = (d or {}).get("metadata", {}).get("labels") or {}
    if d and d["kind"] == sys.argv[2] and labels.get("app.kubernetes.io/component") in ("scheduler", "worker"):
        print("\n".join(d["spec"]["template"]["spec"]["containers"][0]["args"]))
        break' "$manifest" "$kind")
    echo "${binary#"$REPO"/} ${flags[*]} --version"
    "$binary" "${flags[@]}" --version || return 1
  done
}
for spec in "conveyor-scheduler|Deployment" "conveyor-worker|StatefulSet"; do
  IFS='|' read -r name kind <<<"$spec"
  binary=$(newest_binary "$name")
  if [ -n "$binary" ]; then
    check "$name (${binary#"$REPO"/}) accepts every flag the chart passes" \
      accepts_chart_flags "$binary" "$kind" \
      "$OUT"/go/{default,tp2,cpu,toggles,secured,secured-min,replicas,sglang-router,inference-pool}.yaml
  else
    skip "$name flags" "no built $name under build*/"
  fi
done

# ---- The router's flags against the pinned routers -----------------------------------------
# An unknown router flag stops the router: the pinned vllm-router / sglang-router must parse
# every argument the chart renders (their own parse_router_args, which starts nothing) and
# read from it the service discovery the chart meant.
ROUTER_PY="${CONVEYOR_ROUTER_VENV:-/opt/conveyor-router-venv}/bin/python"
router_accepts_chart_flags() {
  local manifest
  for manifest in "$@"; do
    "$PY" - "$manifest" "$WORK/router-args.json" <<'EOF' || return 1
import json, sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    labels = (d or {}).get("metadata", {}).get("labels") or {}
    if d and d["kind"] == "Deployment" and labels.get("app.kubernetes.io/component") == "router":
        json.dump(d["spec"]["template"]["spec"]["containers"][0]["args"], open(sys.argv[2], "w"))
        break
else:
    sys.exit(f"no router Deployment in {sys.argv[1]}")
EOF
    echo "${manifest#"$OUT"/}: $(cat "$WORK/router-args.json")"
    "$ROUTER_PY" - "$WORK/router-args.json" "$TESTS" <<'EOF' || return 1
import importlib, importlib.metadata, json, sys
sys.path.insert(0, sys.argv[2])
from check_dockerfiles import ROUTER_PINS
args = json.load(open(sys.argv[1]))
package = "sglang-router" if args[0] == "launch" else "vllm-router"
installed = importlib.metadata.version(package)
assert installed == ROUTER_PINS[package], f"{package} {installed} installed, the chart pins {ROUTER_PINS[package]}"
module = importlib.import_module(package.replace("-", "_") + ".launch_router")
parsed = module.parse_router_args(args[1:] if package == "sglang-router" else args)
print(package, installed, {k: getattr(parsed, k) for k in (
    "host", "port", "policy", "service_discovery", "selector", "service_discovery_port",
    "service_discovery_namespace", "prometheus_port", "health_check_interval_secs")})
assert parsed.service_discovery and not parsed.worker_urls, "the router must discover its workers"
assert parsed.selector.get("app.kubernetes.io/component") == "scheduler", parsed.selector
EOF
  done
}
if [ -x "$ROUTER_PY" ] && "$ROUTER_PY" -c 'import vllm_router, sglang_router' >/dev/null 2>&1; then
  check "vllm-router and sglang-router parse every router flag the chart passes" \
    router_accepts_chart_flags "$OUT"/go/{replicas,sglang-router}.yaml
else
  skip "router flags" "no vllm-router / sglang-router at $ROUTER_PY (bench/run_router_bench.sh installs them)"
fi

# ---- Docker helper -------------------------------------------------------------------------
if command -v shellcheck >/dev/null; then
  check "shellcheck deploy scripts" shellcheck "$DEPLOY/docker/runtime-packages.sh" "$TESTS/run_chart_tests.sh"
else
  skip "shellcheck" "shellcheck not installed"
fi
check "Dockerfiles: COPY sources exist and stay inside the .dockerignore'd context" \
  "$PY" "$TESTS/check_dockerfiles.py" "$REPO"
binary=$(find "$REPO"/build* -maxdepth 3 -type f \( -name conveyor-worker -o -name conveyor-scheduler \) \
  -perm -u+x 2>/dev/null | head -n 1)
if [ -n "$binary" ] && command -v dpkg-query >/dev/null; then
  runtime_packages() {
    "$DEPLOY/docker/runtime-packages.sh" list "$binary" >"$WORK/runtime-packages.txt" &&
      cat "$WORK/runtime-packages.txt" && grep -q '^libgrpc++' "$WORK/runtime-packages.txt" &&
      "$DEPLOY/docker/runtime-packages.sh" check "$WORK/runtime-packages.txt" &&
      "$DEPLOY/docker/runtime-packages.sh" verify "$binary"
  }
  check "runtime-packages.sh lists the packages of ${binary#"$REPO"/}" runtime_packages
else
  skip "runtime-packages.sh" "no built conveyor-worker/-scheduler under build*/"
fi

echo "$SKIPPED skipped"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
