# meshnet-shard-worker, CPU lane: the portable worker bundle on Debian bookworm. The build
# context is the bundle, not the repository (`make images` does all of this with buildah):
#   meshnet pin build --portable && meshnet worker build --portable
#   meshnet worker bundle --lane cpu --out .work/images/worker-cpu
#   docker build -f images/worker-cpu.Dockerfile \
#     -t meshnet/meshnet-shard-worker-cpu:0.1.0 .work/images/worker-cpu
# The bundle carries ggml's CPU backend for x86-64 (any), Haswell (AVX2/F16C/FMA, where our
# kernels of patches 0006-0008 are) and Skylake-X (AVX-512); the worker loads the best
# one the node's CPU runs, or the one MESHNET_CPU_VARIANT names. No compiler, no build
# tree: the binaries, llama.cpp's shared libraries and their Debian runtime libraries.

ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libgrpc++1.51 libprotobuf32 liblz4-1 libgomp1 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin meshnet
COPY bin/ /usr/local/bin/
COPY lib/ /usr/local/lib/
COPY BUNDLE.json /usr/local/share/meshnet/BUNDLE.json
# OpenMP threads that finished a step spin only briefly (libgomp's default spins for
# much longer), so stages sharing a node's cores do not take them from each other
# (meshnet.local.process.WORKER_ENV_DEFAULTS says what was measured).
ENV GOMP_SPINCOUNT=3000
# Writes nothing outside the mounts it is given: the root filesystem can be read-only.
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
