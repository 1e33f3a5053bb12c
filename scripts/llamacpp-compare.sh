#!/usr/bin/env bash
# Compares ddflash's CPU backend with llama.cpp on the same bf16 weights:
# writes the test model presets, converts them to GGUF (engine/gguf), checks
# greedy agreement, and prints tok/s for both engines, measured interleaved in
# one run, as a Markdown table (tools/llamacompare).
#
# llama.cpp is the prebuilt libllama shipped inside the npm packages of
# node-llama-cpp (pinned in tools/llamacpp/package.json); nothing is built
# or downloaded outside the npm registry. It runs twice: through its C API
# (tools/llamacpp/bench.c, compiled here with the system C compiler against
# that libllama and the headers of the same release, taken from the llama.cpp
# source bundle in the package), which the ratios are taken against, and
# through node-llama-cpp's JavaScript token loop, for reference.
#
#   scripts/llamacpp-compare.sh                       # small and mid, 1 and 2 threads
#   scripts/llamacpp-compare.sh -presets small -threads 2 -reps 3
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd GOFLAGS=-trimpath
llama=tools/llamacpp
if [ ! -d $llama/node_modules/@node-llama-cpp ]; then
	(cd $llama && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --ignore-scripts --no-audit --no-fund)
fi
libs=$llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
build=$llama/build
if [ ! -x $build/bench ] || [ $llama/bench.c -nt $build/bench ]; then
	mkdir -p $build/include
	bundle=$PWD/$llama/node_modules/node-llama-cpp/llama/gitRelease.bundle
	src=$(mktemp -d)
	git -C "$src" init -q
	git -C "$src" fetch -q "$bundle" HEAD
	git -C "$src" archive FETCH_HEAD include/llama.h ggml/include | tar -x -C "$src"
	cp "$src"/include/llama.h "$src"/ggml/include/*.h $build/include/
	rm -rf "$src"
	lib=$(cd $libs && ls libllama.v*.so) ggml=$(cd $libs && ls libggml.v*.so)
	cc -O3 -march=native -Wall -o $build/bench $llama/bench.c -I$build/include \
		-L$libs -l:"$lib" -l:"$ggml" -l:libggml-base.so -Wl,-rpath,"$PWD/$libs" -lpthread
fi
export LLAMA_BACKEND_DIR=$PWD/$libs
exec go run ./tools/llamacompare -cbench $build/bench "$@"
