# The meshnet operator image: `meshnet operator run` (kopf) as a non-root user, on Debian
# bookworm's Python 3.11. Build from the repository root (`make images` does, with buildah):
#   docker build -f images/operator.Dockerfile -t meshnet/meshnet-operator:0.1.0 .
# The protobuf code generator and runtime are pinned to the versions the project's own
# environment tests with (`meshnet images build` passes that environment's): code from a
# newer grpcio-tools than the installed protobuf fails at import.

ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# pyproject.toml reads ../README.md, so keep the repository's shape.
COPY README.md ./README.md
COPY operator/ ./operator/
# The Tracker daemon speaks meshnet.shard.v1: generate its Python code from proto/ here
# (it is gitignored), so the package installs with it and its STAMP.
COPY proto/ ./proto/
ARG GRPCIO_TOOLS_VERSION=1.81.1
ARG PROTOBUF_VERSION=6.33.6
# Where a proxy re-signs TLS, the CA bundle pip must trust while building (not kept in the
# image; `meshnet images build` mounts the host's and names it here).
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python3 -m venv /opt/meshnet \
 && /opt/meshnet/bin/pip install --no-cache-dir \
        "grpcio-tools==${GRPCIO_TOOLS_VERSION}" "protobuf==${PROTOBUF_VERSION}" \
 && PYTHONPATH=operator/src /opt/meshnet/bin/python -m meshnet.route.codegen \
 && /opt/meshnet/bin/pip uninstall -y grpcio-tools \
 && /opt/meshnet/bin/pip install --no-cache-dir "protobuf==${PROTOBUF_VERSION}" ./operator

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="meshnet-operator" \
      org.opencontainers.image.description="Kubernetes operator for Meshnet ModelArtifacts and ShardRoutes" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY --from=build /opt/meshnet /opt/meshnet
# The pin whose digest enters every recipeDigest (MESHNET_PIN_DIGEST overrides it).
COPY llama-pin.yaml /app/llama-pin.yaml
ENV PATH=/opt/meshnet/bin:$PATH \
    MESHNET_REPO=/app \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The same uid the chart's securityContext runs as; the root filesystem can be read-only.
USER 65532:65532
WORKDIR /app
EXPOSE 8080 8081
ENTRYPOINT ["meshnet"]
CMD ["operator", "run"]
