# The certification image of one lane: that lane's worker image plus the meshnet CLI, so
# the operator's certification Job can run `meshnet certify` (the route's stages against
# an unsplit worker started in the same pod, on the same hardware). Built once per lane on
# that lane's worker image, e.g. `meshnet images build --only certify-vulkan` (or, from the
# repository root, `docker build -f images/certify.Dockerfile --build-arg
# WORKER_IMAGE=meshnet/meshnet-shard-worker-vulkan:0.1.0 -t meshnet/meshnet-certify-vulkan:0.1.0 .`);
# set the chart value certify.images.<lane> to it. The Python environment is made with the
# worker image's own Python, so it fits any lane's base.

ARG WORKER_IMAGE=meshnet/meshnet-shard-worker-cpu:0.1.0
FROM ${WORKER_IMAGE}
USER 0
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
WORKDIR /src
COPY README.md ./README.md
COPY operator/ ./operator/
COPY proto/ ./proto/
# Pinned as in images/operator.Dockerfile; the build tree goes with the same step.
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
 && /opt/meshnet/bin/pip install --no-cache-dir "protobuf==${PROTOBUF_VERSION}" ./operator \
 && rm -rf /src
COPY llama-pin.yaml /app/llama-pin.yaml
ENV PATH=/opt/meshnet/bin:$PATH \
    MESHNET_REPO=/app \
    MESHNET_BIN_DIR=/usr/local/bin \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /app
USER 10001:10001
ENTRYPOINT ["meshnet"]
CMD ["certify", "--help"]
