# syntax=docker/dockerfile:1
# conveyor-worker: one tensor-parallel rank.
#
# The build context is the repository root. Default target: the CUDA build on NVIDIA's
# CUDA 13 images (Ubuntu 24.04, whose gRPC 1.51 / protobuf 3.21 / Abseil 20220623 packages
# match Debian 12's):
#   docker build -f deploy/docker/worker.Dockerfile -t conveyor/conveyor-worker:0.1.0 .
# CPU-only image (Debian 12, for kind/laptops; the chart's cpuOnly mode uses tag <appVersion>-cpu):
#   docker build -f deploy/docker/worker.Dockerfile --target cpu -t conveyor/conveyor-worker:0.1.0-cpu .
# BuildKit reads deploy/docker/worker.Dockerfile.dockerignore as the context's ignore file,
# and builds only the stages the chosen target needs.

ARG CUDA_VERSION=13.0.2
ARG UBUNTU_VERSION=24.04
ARG DEBIAN_IMAGE=debian:12
ARG DEBIAN_RUNTIME_IMAGE=debian:12-slim

# ---- CPU build -> target "cpu" ------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS build-cpu
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN rm -rf build \
 && cmake -S . -B build -G Ninja -DCONVEYOR_CUDA=OFF -DCONVEYOR_BUILD_TESTS=OFF -DCONVEYOR_BUILD_BENCH=OFF \
 && ninja -C build conveyor-worker \
 && install -D -m 0755 "$(find build -type f -name conveyor-worker | head -n 1)" /out/conveyor-worker \
 && strip --strip-unneeded /out/conveyor-worker \
 && deploy/docker/runtime-packages.sh list /out/conveyor-worker > /out/runtime-packages.txt

FROM ${DEBIAN_RUNTIME_IMAGE} AS cpu
COPY --from=build-cpu /src/deploy/docker/runtime-packages.sh /usr/local/lib/conveyor/runtime-packages.sh
COPY --from=build-cpu /out/runtime-packages.txt /usr/share/conveyor/runtime-packages.txt
RUN /usr/local/lib/conveyor/runtime-packages.sh install /usr/share/conveyor/runtime-packages.txt \
 && groupadd --system --gid 10001 conveyor \
 && useradd --system --uid 10001 --gid conveyor --home-dir /nonexistent --shell /usr/sbin/nologin conveyor
COPY --from=build-cpu /out/conveyor-worker /usr/local/bin/conveyor-worker
RUN /usr/local/lib/conveyor/runtime-packages.sh verify /usr/local/bin/conveyor-worker
USER 10001:10001
EXPOSE 50061 9401
ENTRYPOINT ["/usr/local/bin/conveyor-worker"]
CMD ["--host=0.0.0.0", "--port=50061", "--metrics_port=9401", "--backend=cpu"]

# ---- CUDA build -> default target ---------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build-cuda
# 90 = H100/H200; e.g. "80;90" adds A100. "native" does not work without a GPU at build time.
ARG CUDA_ARCHITECTURES=90
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# nvcc, cuBLAS and NCCL (libnccl-dev) come with the devel image.
RUN rm -rf build \
 && cmake -S . -B build -G Ninja -DCONVEYOR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
      -DCONVEYOR_BUILD_TESTS=OFF -DCONVEYOR_BUILD_BENCH=OFF \
 && ninja -C build conveyor-worker \
 && install -D -m 0755 "$(find build -type f -name conveyor-worker | head -n 1)" /out/conveyor-worker \
 && strip --strip-unneeded /out/conveyor-worker \
 && deploy/docker/runtime-packages.sh list /out/conveyor-worker > /out/runtime-packages.txt

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS cuda
# The runtime base already holds cudart, cuBLAS and NCCL; this adds the distribution's
# libraries (gRPC, protobuf, ...) and, pinned to the build's versions, any NVIDIA library
# the base lacks. libcuda comes from the host's driver at run time.
COPY --from=build-cuda /src/deploy/docker/runtime-packages.sh /usr/local/lib/conveyor/runtime-packages.sh
COPY --from=build-cuda /out/runtime-packages.txt /usr/share/conveyor/runtime-packages.txt
RUN /usr/local/lib/conveyor/runtime-packages.sh install /usr/share/conveyor/runtime-packages.txt \
 && groupadd --system --gid 10001 conveyor \
 && useradd --system --uid 10001 --gid conveyor --home-dir /nonexistent --shell /usr/sbin/nologin conveyor
COPY --from=build-cuda /out/conveyor-worker /usr/local/bin/conveyor-worker
RUN /usr/local/lib/conveyor/runtime-packages.sh verify /usr/local/bin/conveyor-worker
# The JIT cache must be writable by the non-root user (the chart also mounts /tmp).
ENV CUDA_CACHE_PATH=/tmp/cuda-cache
USER 10001:10001
EXPOSE 50061 9401
ENTRYPOINT ["/usr/local/bin/conveyor-worker"]
CMD ["--host=0.0.0.0", "--port=50061", "--metrics_port=9401", "--backend=cuda"]

LABEL org.opencontainers.image.title="conveyor-worker" \
      org.opencontainers.image.description="Conveyor LLM inference server: tensor-parallel worker rank"
