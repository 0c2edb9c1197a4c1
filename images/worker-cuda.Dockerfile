# meshnet-shard-worker, CUDA lane: the portable build (ggml's CUDA backend for the declared
# architectures, CPU backend for several CPU generations) on NVIDIA's CUDA runtime image.
# Build from the repository root where NVIDIA's images can be pulled:
#   docker build -f images/worker-cuda.Dockerfile -t meshnet/meshnet-shard-worker-cuda:0.1.0 .
# (or `buildah build --isolation chroot ...` the same). GPUs served (CMAKE_CUDA_ARCHITECTURES
# 80-real;86-real;89-real;90, see meshnet.pin.build and the chart README): A100/A30 (sm_80),
# A10/A40/RTX A6000/RTX 30 (sm_86), L4/L40S/RTX 40 (sm_89), H100/H200 (sm_90); newer GPUs
# compile the sm_90 PTX when they first load it. Ubuntu 24.04 brings gRPC 1.51 (the
# callback API the service uses). Pods need the NVIDIA container runtime; the operator
# passes --gpu-layers to stages that have GPUs.

ARG CUDA_VERSION=12.6.3
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates g++ make cmake ninja-build ccache git pkg-config binutils \
        libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc liblz4-dev \
        python3 python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -e 'operator[dev]'
ENV PATH=/venv/bin:$PATH
# No GPU at build time: link against the driver stub.
ENV LIBRARY_PATH=/usr/local/cuda/lib64/stubs
RUN meshnet pin fetch && meshnet pin patch \
 && meshnet pin build --portable --lane cuda \
 && meshnet worker build --portable --lane cuda \
 && meshnet worker bundle --lane cuda --out /bundle

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libgrpc++1.51t64 libprotobuf32t64 liblz4-1 libgomp1 \
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
