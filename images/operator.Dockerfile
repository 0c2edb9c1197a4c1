# The meshnet operator image: `meshnet operator run` (kopf) as a non-root user.
# Build from the repository root:
#   docker build -f images/operator.Dockerfile -t meshnet/meshnet-operator:0.1.0 .

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
# pyproject.toml reads ../README.md, so keep the repository's shape.
COPY README.md ./README.md
COPY operator/ ./operator/
# The Tracker daemon speaks meshnet.shard.v1: generate its Python code from proto/ here
# (it is gitignored), so the package installs with it and its STAMP.
COPY proto/ ./proto/
RUN python -m venv /opt/meshnet \
 && /opt/meshnet/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/meshnet/bin/pip install --no-cache-dir "grpcio-tools>=1.60,<2" \
 && PYTHONPATH=operator/src /opt/meshnet/bin/python -m meshnet.route.codegen \
 && /opt/meshnet/bin/pip uninstall -y grpcio-tools \
 && /opt/meshnet/bin/pip install --no-cache-dir ./operator

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="meshnet-operator" \
      org.opencontainers.image.description="Kubernetes operator for Meshnet ModelArtifacts and ShardRoutes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/meshnet /opt/meshnet
# The pin whose digest enters every recipeDigest (MESHNET_PIN_DIGEST overrides it).
COPY llama-pin.yaml /app/llama-pin.yaml
ENV PATH=/opt/meshnet/bin:$PATH \
    MESHNET_REPO=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The same uid the chart's securityContext runs as; the root filesystem can be read-only.
USER 65532:65532
WORKDIR /app
EXPOSE 8080 8081
ENTRYPOINT ["meshnet"]
CMD ["operator", "run"]
