# meshnet-shard-worker, Vulkan lane: the portable worker bundle (ggml's Vulkan backend, whose
# SPIR-V shaders run on any Vulkan 1.2 device, and the CPU modules of worker-cpu) on Debian
# bookworm. The build context is the bundle (`meshnet images build --only worker-vulkan`
# makes it and builds this with buildah):
#   meshnet pin build --portable --lane vulkan && meshnet worker build --portable --lane vulkan
#   meshnet images build --only worker-vulkan   # context: .work/images/worker-vulkan
# A GPU node brings its Vulkan driver (the NVIDIA container runtime mounts it with the
# `graphics` capability). The image also carries the lane's pinned software device, Mesa
# 25's lavapipe, off by default: on a node without a GPU set
#   VK_DRIVER_FILES=/usr/local/share/meshnet/vulkan/software_device_icd.json
#   GGML_VK_VISIBLE_DEVICES=0   (ggml-vulkan hides CPU-type devices otherwise)
#   MESA_SHADER_CACHE_DIR=<a writable volume>   (lavapipe compiles each shader at first use)
# No compiler, no build tree.

ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# The worker's libraries, the Vulkan loader, and what the pinned lavapipe links (LLVM 15,
# the X11/Wayland client libraries Mesa's window-system code needs even when unused).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libgrpc++1.51 libprotobuf32 liblz4-1 libgomp1 libvulkan1 \
        libllvm15 libdrm2 libexpat1 libzstd1 zlib1g libwayland-client0 libx11-xcb1 \
        libxcb1 libxcb-dri3-0 libxcb-present0 libxcb-randr0 libxcb-shm0 libxcb-sync1 \
        libxcb-xfixes0 libxshmfence1 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin meshnet
COPY bin/ /usr/local/bin/
COPY lib/ /usr/local/lib/
COPY share/ /usr/local/share/
COPY BUNDLE.json /usr/local/share/meshnet/BUNDLE.json
ENV GOMP_SPINCOUNT=3000 \
    NVIDIA_DRIVER_CAPABILITIES=graphics,compute,utility
# Writes nothing outside the mounts it is given: the root filesystem can be read-only.
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
