#!/usr/bin/env bash
# Installs every Debian package that Conveyor's build, tests and benchmarks need.
# Safe to run more than once. Needs root (or sudo) and Debian 12.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config git ca-certificates clang-format clang-tidy curl \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
  prometheus-cpp-dev libgloo-dev libopenblas-dev nlohmann-json3-dev \
  libsentencepiece-dev sentencepiece libspdlog-dev libfmt-dev libpcre2-dev libicu-dev libcpp-httplib-dev libboost-dev \
  libgtest-dev libgmock-dev libbenchmark-dev \
  python3 python3-numpy python3-grpcio python3-matplotlib python3-jinja2 \
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v2-dev yamllint python3-yaml python3-venv \
  prometheus clang libclang-rt-14-dev llvm wamerican >/dev/null
# Test references from PyPI (HF tokenizers, the openai client) in a venv that also sees
# Debian's python3 packages (numpy, grpcio, jinja2). Tests find it at $CONVEYOR_TEST_VENV.
venv="${CONVEYOR_TEST_VENV:-/opt/conveyor-test-venv}"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$(dirname "$0")/../tests/requirements.txt"
# xgrammar, the reference our token masks are compared with (tests/grammar_ref/mask_reference_test),
# in a venv of its own: installed without its declared torch/transformers/triton, which
# computing masks never loads (tests/grammar_ref/requirements.txt says why).
xvenv="${CONVEYOR_XGRAMMAR_VENV:-/opt/conveyor-xgrammar-venv}"
[ -x "$xvenv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$xvenv"
"$xvenv/bin/pip" install -q --disable-pip-version-check --no-deps xgrammar==0.2.9
"$xvenv/bin/pip" install -q --disable-pip-version-check \
  -r "$(dirname "$0")/../tests/grammar_ref/requirements.txt"
# The routers from PyPI that replicas are tested behind (tests/router/router_test.sh).
rvenv="${CONVEYOR_ROUTER_VENV:-/opt/conveyor-router-venv}"
[ -x "$rvenv/bin/python" ] || /usr/bin/python3 -m venv "$rvenv"
"$rvenv/bin/pip" install -q --disable-pip-version-check -r "$(dirname "$0")/../tests/router/requirements.txt"
echo "install-deps: done"
