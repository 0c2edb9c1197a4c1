# The certification image of one lane: that lane's worker image plus the meshnet CLI, so
# the operator's certification Job can run `meshnet certify` (the route's stages against
# an unsplit worker started in the same pod, on the same hardware). Build from the
# repository root, once per lane:
#   docker build -f images/certify.Dockerfile \
#     --build-arg WORKER_IMAGE=meshnet/meshnet-shard-worker-cuda:0.1.0 \
#     -t meshnet/meshnet-certify-cuda:0.1.0 .
# and set the chart value certify.images.<lane> to it.

ARG WORKER_IMAGE=meshnet/meshnet-shard-worker-cpu:0.1.0
FROM ${WORKER_IMAGE}
USER root
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY operator/ ./operator/
COPY proto/ ./proto/
# Generated protobuf code (gitignored) is made here, then installed with the package.
RUN python3 -m venv /opt/meshnet \
 && /opt/meshnet/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/meshnet/bin/pip install --no-cache-dir "grpcio-tools>=1.60,<2" \
 && PYTHONPATH=operator/src /opt/meshnet/bin/python -m meshnet.route.codegen \
 && /opt/meshnet/bin/pip uninstall -y grpcio-tools \
 && /opt/meshnet/bin/pip install --no-cache-dir ./operator \
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
