#!/usr/bin/env bash
# Installs every Debian package that Conveyor's build, tests and benchmarks need.
# Safe to run more than once. Needs root (or sudo) and Debian 12.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config git ca-certificates \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
  prometheus-cpp-dev libgloo-dev libopenblas-dev nlohmann-json3-dev \
  libsentencepiece-dev sentencepiece libspdlog-dev libfmt-dev \
  libgtest-dev libgmock-dev libbenchmark-dev \
  python3 python3-numpy python3-grpcio python3-matplotlib \
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v2-dev yamllint python3-yaml python3-venv \
  prometheus >/dev/null
echo "install-deps: done"
