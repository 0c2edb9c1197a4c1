# meshnet-shard-worker, ROCm (HIP) lane. Build from the repository root:
#   docker build -f images/worker-rocm.Dockerfile -t meshnet-shard-worker:rocm .
# Pods need /dev/kfd and /dev/dri; the operator passes --gpu-layers
# to stages that have GPUs.
# Set AMDGPU_TARGETS at build time for the GPUs the stages run on.

ARG ROCM_VERSION=6.3
FROM rocm/dev-ubuntu-24.04:${ROCM_VERSION}-complete AS build
ARG AMDGPU_TARGETS=gfx90a;gfx942
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates g++ make cmake ninja-build ccache git pkg-config \
        libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
        python3 python3-venv python3-pip hipblas-dev rocblas-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -e 'operator[dev]'
ENV PATH=/venv/bin:$PATH HIPCXX=/opt/rocm/llvm/bin/clang HIP_PATH=/opt/rocm \
    AMDGPU_TARGETS=${AMDGPU_TARGETS}
RUN meshnet pin fetch && meshnet pin patch && meshnet pin build --lane rocm \
    && meshnet worker build --lane rocm \
    && install -D "$(readlink -f .work/worker-build)/build/bin/meshnet-shard-worker" /out/meshnet-shard-worker

FROM rocm/dev-ubuntu-24.04:${ROCM_VERSION}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates libgrpc++1.51t64 libprotobuf32t64 libgomp1 hipblas rocblas \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home meshnet
COPY --from=build /out/meshnet-shard-worker /usr/local/bin/meshnet-shard-worker
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
