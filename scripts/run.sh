#!/usr/bin/env bash
# The README's main job: a short benchmark sweep of a trained pair (autoregressive, linear
# DFlash, DDTree budgets and adaptive speculation) on its held-out prompts, sent as
# plain-text completions since the pairs are base models; verified, then reported.
# The pair is models/demo/ once trained (scripts/train-demo.sh): its 64M-parameter target
# is memory-bound on a CPU, as large models are on a GPU, so verifying several drafted
# tokens costs little more than decoding one. Until then, the embedded tiny pair, whose
# target sits in the CPU's cache, where every verified row costs nearly a decode step.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f models/demo/heldout.jsonl ]; then
	# Its autoregressive decoding is ~10x slower than the tiny pair's: fewer prompts and
	# passes keep the sweep within a couple of minutes.
	pair=(--model models/demo/target --draft models/demo/draft --workloads models/demo/heldout.jsonl --num-prompts 12 --repeats 1)
else
	pair=(--workloads models/default/heldout.jsonl --repeats 2)
fi
out="bench_results/run-$(date +%Y%m%d-%H%M%S)"
bin/ddflash bench --modes auto,linear,b4,b8,b16,adaptive --max-tokens 96 "${pair[@]}" --raw --warmup 1 --out "$out"
bin/ddflash bench verify "$out"
bin/ddflash bench report "$out"
echo "results, CSV and plot: $out"
