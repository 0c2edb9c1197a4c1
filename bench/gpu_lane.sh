#!/usr/bin/env bash
# GPU lane check, run from the repository root on a machine with a GPU:
#
#   MODEL=path/to.gguf [LANE=cuda] [OUT=dir] [ROUTE_BENCH=1] bench/gpu_lane.sh
#
# Builds the pinned, patched llama.cpp for the lane with `meshnet pin build` (needs the
# patched workspace of `meshnet pin patch`, Python 3 with click, pyyaml and pydantic, cmake
# and the lane's compiler), builds the worker's engine, tools and engine tests against it
# (no gRPC service: only the engine needs the GPU), then runs on the GPU:
#   - the engine tests (ctest);
#   - split parity: 3 and 2 stages against the unsplit model, every layer offloaded;
#   - llama-bench on the unsplit model, every layer offloaded, for reference speeds;
#   - with ROUTE_BENCH=1 (needs gRPC C++ for the build, and grpcio, grpcio-status and
#     protobuf for Python): the gRPC worker too, and bench/route_bench.py with every
#     layer offloaded (MODEL must then be SmolLM2-135M: the bench's splits are its 30
#     layers).
# Writes build logs and JSON reports to OUT (default /tmp/gpu-lane).
set -euo pipefail

MODEL=${MODEL:?set MODEL to a GGUF file}
LANE=${LANE:-cuda}
OUT=${OUT:-/tmp/gpu-lane}
PYTHON=${PYTHON:-python3}
WORKER_BUILD=${WORKER_BUILD:-/tmp/meshnet-worker-$LANE}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/operator/src${PYTHONPATH:+:$PYTHONPATH}"

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "llama.cpp, lane $LANE"
LINK=llama-build$([ "$LANE" = cpu ] || echo "-$LANE")  # GPU lanes' builds have their own link
"$PYTHON" -c 'import sys; from meshnet.cli.pin import command; command(sys.argv[1:])' \
    build --lane "$LANE" || { cp "$(readlink -f ".work/$LINK")/build.log" "$OUT/llama-build.log" 2>/dev/null; exit 1; }
LLAMA=$(readlink -f ".work/$LINK")
cp "$LLAMA/build.log" "$OUT/llama-build.log"

step "worker engine and tools"
SERVICE=$([ "${ROUTE_BENCH:-0}" = 1 ] && echo ON || echo OFF)
cmake -S worker -B "$WORKER_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHNET_BUILD_SERVICE=$SERVICE \
    -DCMAKE_PREFIX_PATH="$LLAMA/install" -DMESHNET_TEST_MODEL="$(readlink -f "$MODEL")" >"$OUT/worker-build.log" 2>&1 \
    && cmake --build "$WORKER_BUILD" --parallel >>"$OUT/worker-build.log" 2>&1 \
    || { tail -40 "$OUT/worker-build.log"; exit 1; }

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

step "engine tests"
ctest --test-dir "$WORKER_BUILD" --no-tests=error --output-on-failure

step "split parity, every layer offloaded"
"$WORKER_BUILD/bin/meshnet-range-parity" --model "$MODEL" --split 0:10,10:20,20:30 --split 0:15,15:30 \
    --n-prompt 128 --n-decode 64 --gpu-layers 999 --verbose >"$OUT/parity.json" 2>"$OUT/parity.log" || status=$?
grep -oE "assigned to device [A-Za-z0-9_]+" "$OUT/parity.log" | sort | uniq -c || true
cat "$OUT/parity.json"
[ "${status:-0}" -eq 0 ] || { echo "split parity FAILED (exit $status)"; exit 1; }

step "llama-bench, unsplit, every layer offloaded"
"$LLAMA/install/bin/llama-bench" -m "$MODEL" -ngl 99 -p 128 -n 64 -r 5 --repack 0 -o json >"$OUT/llama-bench.json"
"$PYTHON" - "$OUT/llama-bench.json" <<'EOF'
import json, sys
for row in json.load(open(sys.argv[1])):
    kind = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
    print(f"{kind}: {row['avg_ts']:.1f} tok/s ({row['gpu_info'] or row['cpu_info']})")
EOF
if [ "${ROUTE_BENCH:-0}" = 1 ]; then
    step "route bench, every layer offloaded"
    "$PYTHON" bench/route_bench.py --bin-dir "$WORKER_BUILD/bin" --model "$MODEL" --gpu-layers 999 \
        --repeats "${REPEATS:-3}" --json "$OUT/route-bench.json"
fi
step done
