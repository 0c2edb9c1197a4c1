# meshnet-shard-worker, CUDA lane. Build from the repository root:
#   docker build -f images/worker-cuda.Dockerfile -t meshnet-shard-worker:cuda .
# Ubuntu 24.04 brings gRPC 1.51 (the callback API the service uses). Pods need the
# NVIDIA container runtime; the operator passes --gpu-layers to stages that have GPUs.

ARG CUDA_VERSION=12.6.3
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates g++ make cmake ninja-build ccache git pkg-config \
        libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
        python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -e 'operator[dev]'
ENV PATH=/venv/bin:$PATH
# No GPU at build time: link against the driver stub.
ENV LIBRARY_PATH=/usr/local/cuda/lib64/stubs
RUN meshnet pin fetch && meshnet pin patch && meshnet pin build --lane cuda \
    && meshnet worker build --lane cuda \
    && install -D "$(readlink -f .work/worker-build)/build/bin/meshnet-shard-worker" /out/meshnet-shard-worker

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates libgrpc++1.51t64 libprotobuf32t64 libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home meshnet
COPY --from=build /out/meshnet-shard-worker /usr/local/bin/meshnet-shard-worker
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
