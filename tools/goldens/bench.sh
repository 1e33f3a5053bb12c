#!/usr/bin/env bash
# Encode throughput, on one core, of ddflash's tokenizer and of HF's Rust
# tokenizer (through node), back to back on the same corpora and the same
# Qwen3 tokenizer.json. Run from anywhere after `make deps`:
#   tools/goldens/bench.sh
# Corpora: Go source from $(go env GOROOT)/src (code), and the multilingual
# golden strings of tokenizer/testdata (CJK, Thai, emoji, long runs, ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

goroot=$(go env GOROOT)
# About 4 MB of Go source: every non-test file of a few large packages.
find "$goroot/src/net/http" "$goroot/src/runtime" "$goroot/src/go/types" -maxdepth 1 -name '*.go' ! -name '*_test.go' | sort |
	node -e 'const fs = require("fs"); for (const f of fs.readFileSync(0, "utf8").trim().split("\n")) console.log(JSON.stringify(fs.readFileSync(f, "utf8")))' \
		>"$work/go_source.jsonl"
gzip -dc tokenizer/testdata/qwen3_encode.jsonl.gz | node -e '
	for (const l of require("fs").readFileSync(0, "utf8").trim().split("\n")) console.log(JSON.stringify(JSON.parse(l).text))' \
	>"$work/multilingual.jsonl"

go test -c -o "$work/tokenizer.test" ./tokenizer
for corpus in go_source multilingual; do
	echo "== $corpus"
	RAYON_NUM_THREADS=1 taskset -c 0 node tools/goldens/bench.js "$work/$corpus.jsonl" 5
	(cd tokenizer && GOMAXPROCS=1 taskset -c 0 "$work/tokenizer.test" -test.run '^$' -test.bench '^BenchmarkEncode$' \
		-test.benchtime 5x -corpus "$work/$corpus.jsonl" | grep -E '^Benchmark' | sed 's/^/ddflash: /')
done
