# syntax=docker/dockerfile:1
# conveyor-scheduler: CPU only, on Debian 12.
#
# The build context is the repository root:
#   docker build -f deploy/docker/scheduler.Dockerfile -t conveyor/conveyor-scheduler:0.1.0 .
# BuildKit (Docker 23+ default) reads deploy/docker/scheduler.Dockerfile.dockerignore as the
# context's ignore file, which keeps build trees, .git and the rest of deploy/ out.

ARG DEBIAN_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim

# ---- build ------------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS build
WORKDIR /src
# The toolchain and -dev packages first: this layer survives source edits.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# A stale build tree from the host (a non-BuildKit build ignores the .dockerignore) would
# point CMake at the host's paths; start clean.
RUN rm -rf build \
 && cmake -S . -B build -G Ninja -DCONVEYOR_CUDA=OFF -DCONVEYOR_BUILD_TESTS=OFF -DCONVEYOR_BUILD_BENCH=OFF \
 && ninja -C build conveyor-scheduler \
 && install -D -m 0755 "$(find build -type f -name conveyor-scheduler | head -n 1)" /out/conveyor-scheduler \
 && strip --strip-unneeded /out/conveyor-scheduler \
 && deploy/docker/runtime-packages.sh list /out/conveyor-scheduler > /out/runtime-packages.txt

# ---- runtime ----------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE}
# Only the shared libraries the scheduler links (Debian 12 names). The checks below fail the
# build if the binary needs a package missing here.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 \
      libsentencepiece0 libopenblas0 libspdlog1.10 libfmt9 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 conveyor \
 && useradd --system --uid 10001 --gid conveyor --home-dir /nonexistent --shell /usr/sbin/nologin conveyor
COPY --from=build /out/conveyor-scheduler /usr/local/bin/conveyor-scheduler
COPY --from=build /out/runtime-packages.txt /usr/share/conveyor/runtime-packages.txt
COPY --from=build /src/deploy/docker/runtime-packages.sh /usr/local/lib/conveyor/runtime-packages.sh
RUN /usr/local/lib/conveyor/runtime-packages.sh check /usr/share/conveyor/runtime-packages.txt \
 && /usr/local/lib/conveyor/runtime-packages.sh verify /usr/local/bin/conveyor-scheduler

USER 10001:10001
# gRPC Generate + health, the OpenAI-compatible HTTP API, Prometheus /metrics.
EXPOSE 50051 8000 9400
ENTRYPOINT ["/usr/local/bin/conveyor-scheduler"]
CMD ["--host=0.0.0.0", "--port=50051", "--http_port=8000", "--metrics_port=9400"]

LABEL org.opencontainers.image.title="conveyor-scheduler" \
      org.opencontainers.image.description="Conveyor LLM inference server: request scheduler (CPU only)"
