#!/usr/bin/env bash
# The adaptive budget against every fixed choice, in one sweep per prompt
# style: the default pair's held-out prompts (plain-text completions) and
# the built-in chat and code (fibonacci) conversations, each at concurrency
# 1 and 4; verified (greedy outputs must equal autoregressive), then
# reported together. The modes' passes are interleaved (--interleave), so a
# machine's changing load falls on every mode alike. Even so, one pass's
# throughput varies by 10-20 % on the 2-core development machine, and two
# modes' ratio over 30 passes still has a standard error of 1.5-2 %; a pass
# of the chat and code workloads is short (a few hundred milliseconds:
# 96-token replies), so they get 40 passes to the held-out prompts' 16.
# Extra arguments go to both sweeps (e.g. --threads 1).
set -euo pipefail
cd "$(dirname "$0")/.."
out="bench_results/adaptive-$(date +%Y%m%d-%H%M%S)"
modes=auto,linear,b4,b8,b16,b32,adaptive
bin/ddflash bench --modes "$modes" --concurrency 1,4 --max-tokens 96 --repeats 16 --warmup 1 --interleave \
	--workloads models/default/heldout.jsonl --raw --out "$out/heldout" "$@"
bin/ddflash bench --modes "$modes" --concurrency 1,4 --max-tokens 96 --repeats 40 --warmup 1 --interleave \
	--workloads chat,fibonacci --out "$out/chat-code" "$@"
bin/ddflash bench verify "$out/heldout"
bin/ddflash bench verify "$out/chat-code"
bin/ddflash bench report --out "$out/report" "$out/heldout" "$out/chat-code"
echo "results, CSV and plot: $out"
