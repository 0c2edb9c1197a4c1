# meshnet-shard-worker, Vulkan lane: the portable build (ggml's Vulkan backend, whose
# SPIR-V shaders run on any Vulkan 1.2 GPU, CPU backend for several CPU generations) on
# Debian bookworm. Build from the repository root (`--build-arg BASE_IMAGE=` a local Debian
# bookworm image where no registry is reachable, as `make images` uses for the CPU lane):
#   docker build -f images/worker-vulkan.Dockerfile -t meshnet/meshnet-shard-worker-vulkan:0.1.0 .
# Pods need the GPU's Vulkan ICD (e.g. /dev/dri plus the vendor's ICD JSON mounted); the
# operator passes --gpu-layers to stages that have GPUs.

ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates g++ make cmake ninja-build ccache git pkg-config binutils \
        libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc liblz4-dev \
        python3 python3-venv python3-pip \
        glslc libvulkan-dev spirv-headers mesa-vulkan-drivers vulkan-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -e 'operator[dev]'
ENV PATH=/venv/bin:$PATH
RUN meshnet pin fetch && meshnet pin patch \
 && meshnet pin build --portable --lane vulkan \
 && meshnet worker build --portable --lane vulkan \
 && meshnet worker bundle --lane vulkan --out /bundle

FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libgrpc++1.51 libprotobuf32 liblz4-1 libgomp1 libvulkan1 mesa-vulkan-drivers \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin meshnet
COPY --from=build /bundle/bin/ /usr/local/bin/
COPY --from=build /bundle/lib/ /usr/local/lib/
COPY --from=build /bundle/BUNDLE.json /usr/local/share/meshnet/BUNDLE.json
ENV GOMP_SPINCOUNT=3000
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
