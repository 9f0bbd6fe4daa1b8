# syntax=docker/dockerfile:1
# conveyor-router: a router from PyPI in front of several Conveyor replicas (the chart's
# router.*; docs/scaling.md). One image per router, chosen by build argument; the package
# versions are pinned here, and the chart's default image tag is <package>-<version>:
#   docker build -f deploy/docker/router.Dockerfile -t conveyor/conveyor-router:vllm-router-0.1.17 .
#   docker build -f deploy/docker/router.Dockerfile --build-arg ROUTER_PACKAGE=sglang-router \
#     --build-arg ROUTER_VERSION=0.3.2 -t conveyor/conveyor-router:sglang-router-0.3.2 .
# Nothing is copied from the build context (deploy/docker/router.Dockerfile.dockerignore
# excludes all of it). The entrypoint is the router's own command; sglang-router's
# arguments start with its `launch` subcommand (the chart passes it).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE}
ARG ROUTER_PACKAGE=vllm-router
ARG ROUTER_VERSION=0.1.17
# Only the versions the chart was checked against (their flags, /liveness and /readiness,
# Kubernetes service discovery): another version is a deliberate edit of this list.
RUN case "${ROUTER_PACKAGE}==${ROUTER_VERSION}" in \
      vllm-router==0.1.17|sglang-router==0.3.2) ;; \
      *) echo "unpinned router ${ROUTER_PACKAGE}==${ROUTER_VERSION}: pin vllm-router==0.1.17 or sglang-router==0.3.2" >&2; exit 1 ;; \
    esac \
 && python -m venv /opt/router \
 && /opt/router/bin/pip install --no-cache-dir --disable-pip-version-check "${ROUTER_PACKAGE}==${ROUTER_VERSION}" \
 && /opt/router/bin/pip check \
 && ln -s "/opt/router/bin/${ROUTER_PACKAGE}" /usr/local/bin/conveyor-router \
 && groupadd --system --gid 10001 conveyor \
 && useradd --system --uid 10001 --gid conveyor --home-dir /nonexistent --shell /usr/sbin/nologin conveyor

# The chart mounts an emptyDir at /tmp (read-only root filesystem).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
# The OpenAI API (the chart's router.port) and Prometheus metrics (router.metricsPort).
EXPOSE 8000 29000
ENTRYPOINT ["/usr/local/bin/conveyor-router"]

LABEL org.opencontainers.image.title="conveyor-router" \
      org.opencontainers.image.description="vllm-router or sglang-router (PyPI, pinned) for Conveyor replicas"
