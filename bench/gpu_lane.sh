#!/usr/bin/env bash
# The GPU check: one script for a machine with a GPU, run from the repository root.
#
#   bench/gpu_lane.sh prepare [DIR]     # here, with network: what a bare GPU machine lacks
#   [LANE=cuda] [ALSO_VULKAN=1] [OUT=dir] bench/gpu_lane.sh
#
# `prepare` writes DIR (default .work/gpu-lane, under 64 MiB) for a machine that can fetch
# nothing: the patched llama.cpp sources (no models, docs or history), Debian bookworm's gRPC,
# protobuf, OpenSSL and lz4 development packages, Python 3.12 wheels of what our tests import
# beyond a CUDA machine's usual Python (pydantic, gguf, grpcio at our version...), and the
# generated protocol code. On a checkout without `make setup`'s environment the check unpacks
# DIR into private prefixes (never system-wide) first; elsewhere it takes that environment.
#
# The check, for LANE (cuda by default; also vulkan with ALSO_VULKAN=1, on the same GPU):
#   - builds the lane's llama.cpp and worker (`meshnet pin build`, `meshnet worker build`);
#   - test-deepseek4-steps with every layer on the device (step invariance at V4-Flash's
#     indexer top-k of 512, past 2048 positions);
#   - the tests marked `gpu_lane` on that lane (MESHNET_TEST_GPU_LANE): split parity
#     bit-exact, verify windows of 2, 5 and 8 rows bit-identical to one-row steps, 1, 8 and
#     16 concurrent sessions identical to each alone, speculation (the lookup ring serial and
#     pipelined, MTP, DSpark; greedy and seeded) identical to plain decoding, on SmolLM2 and
#     the tiny deepseek4 models, every layer offloaded;
#   - each stage's start-up exactness probe as the workers logged it (exact_step_rows,
#     exact_batching), per model and stage;
#   - bench/lane_exactness.py (the per-device figures on SmolLM2) and bench/route_bench.py
#     (a 2-stage route against the unsplit model, every layer offloaded).
# SmolLM2 (94 MB) is too big to carry to a bare machine: there its cases are skipped with
# that reason, and the summary says so. One JSON summary: $OUT/gpu-lane.json.
set -uo pipefail

REPO=$(pwd)
CARRY=${CARRY:-$REPO/.work/gpu-lane}
OUT=${OUT:-/tmp/gpu-lane}
LANE=${LANE:-cuda}
LANES="$LANE${ALSO_VULKAN:+ vulkan}"
# What our tests import that a CUDA machine's Python (PyTorch's image) may lack or hold at a
# version our generated code refuses (grpcio, protobuf).
WHEELS="pydantic pydantic-core annotated-types typing-inspection gguf grpcio grpcio-status
grpcio-health-checking protobuf googleapis-common-protos lz4 jsonschema referencing
jsonschema-specifications rpds-py common-expression-language pytest-asyncio sniffio"
# The worker's build dependencies a CUDA image lacks (Debian bookworm's, unpacked privately).
DEBS="libgrpc++-dev libgrpc-dev libgrpc++1.51 libgrpc29 protobuf-compiler-grpc libprotobuf-dev
libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler libabsl-dev libabsl20220623
libre2-dev libre2-9 libc-ares-dev libc-ares2 libssl-dev libssl3 zlib1g-dev liblz4-dev liblz4-1
pkgconf pkgconf-bin libpkgconf3"
LLAMA_SKIPPED=(.git models docs media gguf-py examples tools/server/public)

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }
die() { echo "gpu_lane: $*" >&2; exit 1; }

prepare() {
    local dir=${1:-$CARRY} python=$REPO/.venv/bin/python
    [ -x "$python" ] || die "prepare needs the checkout's environment: run \`make setup\` first"
    [ -f .work/llama.cpp.json ] || die "no patched llama.cpp: run \`meshnet pin patch\` first"
    rm -rf "$dir" && mkdir -p "$dir/debs" "$dir/wheels"
    step "llama.cpp sources"
    tar -C .work -czf "$dir/llama.tar.gz" "${LLAMA_SKIPPED[@]/#/--exclude=llama.cpp/}" \
        llama.cpp llama.cpp.json || die "could not pack .work/llama.cpp"
    step "Debian packages"
    (cd "$dir/debs" && apt-get download $DEBS) || die "apt-get download failed"
    step "Python 3.12 wheels"
    local pins
    pins=$("$python" - $WHEELS <<'EOF'
import sys
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
EOF
) || die "a carried package is not installed here"
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$dir/wheels" $pins 2> >(grep -v "is ignored" >&2) \
        || die "pip download failed"
    step "generated protocol code"
    tar -C operator/src -czf "$dir/proto.tar.gz" meshnet/_proto || die "no generated code: \`make proto\`"
    local mib
    mib=$(du -sm "$dir" | cut -f1)
    echo "$dir: $mib MiB"
    [ "$mib" -lt 60 ] || die "$dir is $mib MiB: over what travels to a bare machine"
}

# A bare machine (no environment of `make setup`): the carried folder unpacked into private
# prefixes.
bootstrap() {
    [ -d "$CARRY" ] && [ ! -x .venv/bin/python ] || return 0
    step "unpacking $CARRY"
    local root=$CARRY/root site=$CARRY/site
    if [ ! -d "$root" ]; then
        mkdir -p "$root.partial" && for deb in "$CARRY"/debs/*.deb; do dpkg -x "$deb" "$root.partial"; done
        # pkg-config files name /usr: point them at the private root
        sed -i "s|^prefix=/usr|prefix=$root/usr|" "$root.partial"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
        mv "$root.partial" "$root"
    fi
    [ -d "$site" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        "$CARRY"/wheels/*.whl || die "the carried wheels do not install"
    [ -f .work/llama.cpp.json ] || { mkdir -p .work && tar -C .work -xzf "$CARRY/llama.tar.gz"; }
    [ -d operator/src/meshnet/_proto ] || tar -C operator/src -xzf "$CARRY/proto.tar.gz"
    export CMAKE_PREFIX_PATH=$root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
    export PKG_CONFIG_PATH=$root/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PATH=$root/usr/bin:$PATH PYTHONPATH=$site
}

[ "${1:-}" = prepare ] && { prepare "${2:-}"; exit; }
[ $# -eq 0 ] || die "usage: bench/gpu_lane.sh [prepare [DIR]]"

mkdir -p "$OUT"
bootstrap
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo "$REPO/.venv/bin/python" || echo python3)}
export PYTHONPATH=$REPO/operator/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# `meshnet pin|worker ...` without the CLI's other commands (and the operator's packages).
meshnet() {
    "$PYTHON" -c 'import importlib, sys; importlib.import_module(f"meshnet.cli.{sys.argv[1]}").command(
        sys.argv[2:], prog_name=f"meshnet {sys.argv[1]}")' "$@"
}
"$PYTHON" -c 'from meshnet.bundled import smollm2_gguf; smollm2_gguf()' 2>/dev/null \
    || export MESHNET_TEST_NO_SMOLLM2="SmolLM2 (94 MB) is not installed on this machine"

step "tiny deepseek4 models"
MODELS=$OUT/models && mkdir -p "$MODELS"
# as the Makefile's test-cpp-vulkan has them (the same generator, shapes and seeds)
"$PYTHON" -m meshnet.devtools tiny-deepseek4 "$MODELS/selecting.gguf" --layers 8 --indexer-top-k 4 \
    --experts q8_0 --seed 2 >/dev/null && "$PYTHON" -m meshnet.devtools tiny-deepseek4 \
    "$MODELS/topk512.gguf" --layers 8 --indexer-top-k 512 --seed 3 >/dev/null || die "could not write the tiny models"

for lane in $LANES; do
    step "build, lane $lane"
    start=$SECONDS
    { meshnet pin build --lane "$lane" && meshnet worker build --lane "$lane"; } >"$OUT/build-$lane.log" 2>&1 \
        || { tail -40 "$OUT/build-$lane.log"; die "the $lane lane did not build"; }
    echo $((SECONDS - start)) >"$OUT/build-$lane.seconds"
    BIN=$(dirname "$("$PYTHON" -c "from meshnet.local.process import worker_binary; print(worker_binary(lane='$lane'))")")

    step "device, lane $lane"  # as the lane's workers see it (the software device's env too)
    if [ "$lane" = vulkan ]; then
        env $(meshnet worker device-env) vulkaninfo --summary 2>/dev/null | grep -E "deviceName|driverInfo"
    else
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    fi | tee "$OUT/device-$lane.txt"

    step "test-deepseek4-steps on the device, lane $lane"
    env $(meshnet worker device-env) MESHNET_TEST_GPU_LAYERS=99 \
        MESHNET_TEST_DS4_SELECTING_MODEL="$MODELS/selecting.gguf" MESHNET_TEST_DS4_TOPK512_MODEL="$MODELS/topk512.gguf" \
        "$BIN/test-deepseek4-steps" >"$OUT/steps-$lane.log" 2>&1
    echo $? >"$OUT/steps-$lane.rc"; tail -3 "$OUT/steps-$lane.log"

    step "the gpu_lane tests, lane $lane"
    MESHNET_TEST_GPU_LANE=$lane "$PYTHON" -m pytest -m gpu_lane -p no:cacheprovider \
        --junitxml="$OUT/tests-$lane.xml" --basetemp="$OUT/pytest-$lane" \
        tests/parity tests/route tests/deepseek4 >"$OUT/tests-$lane.log" 2>&1
    grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/tests-$lane.log" | tail -25

    if [ -z "${MESHNET_TEST_NO_SMOLLM2:-}" ]; then
        step "exactness figures and route speed, lane $lane"
        "$PYTHON" bench/lane_exactness.py --lane "$lane" --json "$OUT/exactness-$lane.json" | tail -20
        "$PYTHON" bench/route_bench.py --lane "$lane" --repeats "${REPEATS:-3}" \
            --tokens "${TOKENS:-32}" --json "$OUT/route-$lane.json" | tail -12
    fi
done

step "summary"
"$PYTHON" bench/gpu_lane_summary.py "$OUT" $LANES | tee "$OUT/gpu-lane.json"
