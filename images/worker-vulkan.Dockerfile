# meshnet-shard-worker, Vulkan lane. Build from the repository root:
#   docker build -f images/worker-vulkan.Dockerfile -t meshnet-shard-worker:vulkan .
# Pods need the GPU's Vulkan ICD (e.g. /dev/dri plus the vendor's ICD JSON mounted);
# the operator passes --gpu-layers to stages that have GPUs.

FROM debian:bookworm AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates g++ make cmake ninja-build ccache git pkg-config \
        libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
        python3 python3-venv python3-pip libvulkan-dev glslc \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -e 'operator[dev]'
ENV PATH=/venv/bin:$PATH
RUN meshnet pin fetch && meshnet pin patch && meshnet pin build --lane vulkan \
    && meshnet worker build --lane vulkan \
    && install -D "$(readlink -f .work/worker-build)/build/bin/meshnet-shard-worker" /out/meshnet-shard-worker

FROM debian:bookworm-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates libgrpc++1.51 libprotobuf32 libgomp1 libvulkan1 mesa-vulkan-drivers \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home meshnet
COPY --from=build /out/meshnet-shard-worker /usr/local/bin/meshnet-shard-worker
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
