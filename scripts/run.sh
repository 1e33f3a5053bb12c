#!/usr/bin/env bash
# The README's main job: a short benchmark sweep of the demo pair (models/demo/, trained by
# scripts/train-demo.sh) on its held-out prompts: autoregressive, linear DFlash, DDTree budgets
# with the drafter's whole block and with a block cut to the tree's depth (-dK), adaptive
# speculation, and the target's own MTP head; sent as plain-text completions since the pair is
# a base model; verified, then reported. Its 64M-parameter target is memory-bound on a CPU, as
# large models are on a GPU, so verifying a few drafted tokens costs little more than decoding
# one. The modes' passes are interleaved, so a machine's changing load falls on all of them.
set -euo pipefail
cd "$(dirname "$0")/.."
modes=${DDFLASH_RUN_MODES:-auto,linear,linear-d8,b4-d4,b8,b8-d6,adaptive,adaptive-d4,mtp3}
out="bench_results/run-$(date +%Y%m%d-%H%M%S)"
bin/ddflash bench --model models/demo/target --draft models/demo/draft --workloads models/demo/heldout.jsonl \
	--num-prompts 12 --modes "$modes" --max-tokens 96 --raw --warmup 1 --repeats 2 --interleave --out "$out"
bin/ddflash bench verify "$out"
bin/ddflash bench report "$out"
echo "results, CSV and plot: $out"
