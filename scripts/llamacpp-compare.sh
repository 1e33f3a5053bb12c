#!/usr/bin/env bash
# Compares ddflash's CPU backend with llama.cpp on the same bf16 weights:
# writes the test model presets, converts them to GGUF (engine/gguf), checks
# greedy agreement, and prints tok/s for both engines, measured interleaved in
# one run, as a Markdown table (tools/llamacompare).
#
# llama.cpp is the prebuilt libllama shipped inside the npm packages of
# node-llama-cpp (pinned in tools/llamacpp/package.json); nothing is built
# or downloaded outside the npm registry.
#
#   scripts/llamacpp-compare.sh                       # small and mid, 1 and 2 threads
#   scripts/llamacpp-compare.sh -presets small -threads 2 -reps 3
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd GOFLAGS=-trimpath
if [ ! -d tools/llamacpp/node_modules/@node-llama-cpp ]; then
	(cd tools/llamacpp && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --ignore-scripts --no-audit --no-fund)
fi
exec go run ./tools/llamacompare "$@"
