# meshnet-shard-worker, ROCm (HIP) lane: the portable build (ggml's HIP backend for the
# declared GPU targets, CPU backend for several CPU generations) on AMD's ROCm image.
# Build from the repository root where AMD's images can be pulled:
#   docker build -f images/worker-rocm.Dockerfile -t meshnet/meshnet-shard-worker-rocm:0.1.0 .
# GPUs served (GPU_TARGETS gfx90a;gfx942, see meshnet.pin.build): MI210/MI250 (gfx90a) and
# MI300A/MI300X/MI325X (gfx942). Pods need /dev/kfd and /dev/dri; the operator passes
# --gpu-layers to stages that have GPUs.

ARG ROCM_VERSION=6.3
FROM rocm/dev-ubuntu-24.04:${ROCM_VERSION}-complete AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates g++ make cmake ninja-build ccache git pkg-config binutils \
        libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc liblz4-dev \
        python3 python3-venv python3-pip hipblas-dev rocblas-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -e 'operator[dev]'
ENV PATH=/venv/bin:$PATH HIPCXX=/opt/rocm/llvm/bin/clang HIP_PATH=/opt/rocm
RUN meshnet pin fetch && meshnet pin patch \
 && meshnet pin build --portable --lane rocm \
 && meshnet worker build --portable --lane rocm \
 && meshnet worker bundle --lane rocm --out /bundle

FROM rocm/dev-ubuntu-24.04:${ROCM_VERSION}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libgrpc++1.51t64 libprotobuf32t64 liblz4-1 libgomp1 hipblas rocblas \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin meshnet
COPY --from=build /bundle/bin/ /usr/local/bin/
COPY --from=build /bundle/lib/ /usr/local/lib/
COPY --from=build /bundle/BUNDLE.json /usr/local/share/meshnet/BUNDLE.json
ENV GOMP_SPINCOUNT=3000
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
