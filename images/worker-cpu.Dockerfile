# meshnet-shard-worker, CPU lane. Build from the repository root:
#   docker build -f images/worker-cpu.Dockerfile -t meshnet-shard-worker:cpu .
# The builder fetches and verifies the pinned llama.cpp (sdist from PyPI), applies
# patches/, builds it and worker/, then the runtime stage keeps only the binary and the
# shared libraries it needs. Runs as a non-root user; the model is mounted read-only.
# Note: the pinned build is tuned to the build host's CPU (GGML_NATIVE); build this image
# on (or for) the CPU generation the stage nodes have.

FROM debian:bookworm AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates g++ make cmake ninja-build ccache git pkg-config \
        libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
        python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -e 'operator[dev]'
ENV PATH=/venv/bin:$PATH
RUN meshnet pin fetch && meshnet pin patch && meshnet pin build --lane cpu \
    && meshnet worker build --lane cpu \
    && install -D "$(readlink -f .work/worker-build)/build/bin/meshnet-shard-worker" /out/meshnet-shard-worker

FROM debian:bookworm-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates libgrpc++1.51 libprotobuf32 libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home meshnet
COPY --from=build /out/meshnet-shard-worker /usr/local/bin/meshnet-shard-worker
# OpenMP threads that finished a step spin only briefly (libgomp's default spins for
# much longer), so stages sharing a node's cores do not take them from each other
# (meshnet.route.launch.WORKER_ENV_DEFAULTS says what was measured).
ENV GOMP_SPINCOUNT=3000
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/meshnet-shard-worker"]
CMD ["--help"]
