# syntax=docker/dockerfile:1
# The exporter as a sidecar image: Python, the exporter and its runtime dependencies in a venv,
# nothing else (no torch: the reference engine lives behind an extra that is not installed).
#
# BASE_IMAGE: any image with Python >= 3.11 whose `python3 -m venv` works, used for both stages
# (the venv's interpreter link must resolve in the runtime stage). Without a registry, build one
# with build-tools/build-base-image.sh (debootstrap); `make image` does both.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
RUN python3 -m venv /opt/exporter
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# Install non-editable with the `node` extra (gRPC for the node agent's PodResources client: one
# image serves the sidecar and the node agent), then drop the installers: the runtime venv needs
# neither pip nor setuptools, and bytecode is compiled here because the root filesystem is
# read-only at run time.
# The optional secret `pip-cert` is a CA bundle for networks whose TLS to PyPI is intercepted
# (`--secret id=pip-cert,src=/etc/ssl/certs/ca-certificates.crt`); it never enters a layer.
RUN --mount=type=secret,id=pip-cert \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
    && /opt/exporter/bin/pip install --no-cache-dir ".[node]" \
    && /opt/exporter/bin/pip uninstall --yes pip setuptools \
    && /opt/exporter/bin/python -m compileall -q /opt/exporter/lib \
    && /opt/exporter/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"

FROM ${BASE_IMAGE}
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.title="inference-bottleneck-exporter" \
      org.opencontainers.image.description="Prometheus exporter sidecar that finds what a GPU LLM inference server is waiting for" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/inference-bottleneck-exporter/inference-bottleneck-exporter" \
      org.opencontainers.image.documentation="https://github.com/inference-bottleneck-exporter/inference-bottleneck-exporter/blob/main/docs/deployment.md"
COPY --from=build /opt/exporter /opt/exporter
# Nothing is written at run time: no bytecode, unbuffered logs to stdout/stderr.
ENV PATH=/opt/exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# nobody:nogroup, numeric so that Kubernetes' runAsNonRoot can verify it.
USER 65534:65534
EXPOSE 10960
# No HEALTHCHECK: Kubernetes probes /-/healthy and /-/ready.
ENTRYPOINT ["/opt/exporter/bin/inference-bottleneck-exporter"]
