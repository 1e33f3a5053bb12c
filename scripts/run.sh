#!/usr/bin/env bash
# The README's main job: a short benchmark sweep of the embedded default pair
# (autoregressive, linear DFlash and DDTree budgets) on its held-out prompts,
# sent as plain-text completions since the pair is a base model; verified,
# then reported.
set -euo pipefail
cd "$(dirname "$0")/.."
out="bench_results/run-$(date +%Y%m%d-%H%M%S)"
bin/ddflash bench --modes auto,linear,b8,b16,b32 --max-tokens 96 --workloads models/default/heldout.jsonl --raw --repeats 2 --warmup 1 --out "$out"
bin/ddflash bench verify "$out"
bin/ddflash bench report "$out"
echo "results, CSV and plot: $out"
