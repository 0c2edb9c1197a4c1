#!/usr/bin/env bash
# `make demo`: what is built, then the whole system on one machine (meshnet demo).
set -euo pipefail
MESHNET=.venv/bin/meshnet
printf '\n\033[1m== 0. The pinned llama.cpp this build uses\033[0m\n'
$MESHNET pin status
$MESHNET demo
