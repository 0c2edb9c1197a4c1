#!/usr/bin/env bash
# `make demo`: run the main job available on the embedded default, saying what runs.
set -euo pipefail
MESHNET=.venv/bin/meshnet
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "The pinned llama.cpp (commit, tree, patch stack, build):"
$MESHNET pin status

MODEL=$(.venv/bin/python -c 'from meshnet.bundled import smollm2_gguf; print(smollm2_gguf())')
say "Split parity on the bundled SmolLM2-135M (30 layers): 2 and 3 stages vs the unsplit model"
echo "\$ meshnet parity --model $MODEL --split 0:15,15:30 --split 0:10,10:20,20:30"
$MESHNET parity --model "$MODEL" --split 0:15,15:30 --split 0:10,10:20,20:30
