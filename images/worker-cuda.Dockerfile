# meshnet-shard-worker, CUDA lane: the portable worker bundle (ggml's CUDA backend for the
# declared architectures, the CPU modules of worker-cpu) on Debian bookworm, with the CUDA
# 13 runtime and cuBLAS libraries as NVIDIA's wheels ship them (and their licence, under
# /usr/local/share/doc/). No driver: the NVIDIA container runtime mounts the node's
# libcuda.so.1 (driver 580 or newer); the worker exits 1 saying so where there is none. No
# toolkit, no compiler. `meshnet images build --only worker-cuda` makes the context and
# builds this with buildah, once the portable CUDA build exists (hours on 2 cores):
#   meshnet pin build --portable --lane cuda && meshnet worker build --portable --lane cuda
# GPUs served (CMAKE_CUDA_ARCHITECTURES 80-real;86-real;89-real;90): the chart README.

ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libgrpc++1.51 libprotobuf32 liblz4-1 libgomp1 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin meshnet
COPY bin/ /usr/local/bin/
COPY lib/ /usr/local/lib/
COPY share/ /usr/local/share/
COPY BUNDLE.json /usr/local/share/meshnet/BUNDLE.json
# ggml's CUDA module (in /usr/local/bin) has no run path: the loader's cache must know
# the CUDA libraries in /usr/local/lib.
RUN ldconfig
# What the NVIDIA container runtime gives a pod: its GPUs (the device plugin narrows this
# to the ones requested) and the driver's compute libraries.
ENV GOMP_SPINCOUNT=3000 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
