#!/usr/bin/env bash
# The adaptive budget against every fixed choice, in one sweep per prompt
# style: the default pair's held-out prompts (plain-text completions) and
# the built-in chat and code (fibonacci) conversations, each at concurrency
# 1 and 4; verified (greedy outputs must equal autoregressive), then
# reported together, with each adaptive mode's ratio to the best fixed mode
# of every cell. The modes' passes are interleaved (--interleave), so a
# machine's changing load falls on every mode alike. Even so, one pass's
# throughput varies by 10-20 % on the 2-core development machine, and two
# modes' ratio over 30 passes still has a standard error of 1.5-2 %; a pass
# of the chat and code workloads is short (a few hundred milliseconds:
# 96-token replies), so they get 40 passes to the held-out prompts' 16.
#
# --drafters sweeps the choice among drafters instead: the demo pair
# (models/demo: a DFlash drafter and the target's trained MTP head) on its
# held-out prompts at concurrency 1 and 4, adaptive choosing between both
# drafters (adaptive-mtp-d4: DFlash drafts cut to 4 tokens, as the pair's
# best tree) against each drafter's fixed modes and adaptive over DFlash
# alone. The pair is a base model of one corpus, so it has no chat or code
# cells; its passes (12 prompts) take 3-7 s each, so 16 of them suffice.
# Extra arguments go to every sweep (e.g. --threads 1).
set -euo pipefail
cd "$(dirname "$0")/.."
out="bench_results/adaptive-$(date +%Y%m%d-%H%M%S)"
if [[ "${1:-}" == --drafters ]]; then
	shift
	bin/ddflash bench --model models/demo/target --draft models/demo/draft \
		--modes auto,mtp2,mtp3,linear-d8,b4-d4,b8-d6,adaptive-d4,adaptive-mtp-d4 \
		--concurrency 1,4 --max-tokens 96 --repeats 16 --warmup 1 --interleave \
		--workloads models/demo/heldout.jsonl --num-prompts 12 --raw --out "$out/drafters" "$@"
	bin/ddflash bench verify "$out/drafters"
	bin/ddflash bench report --out "$out/report" "$out/drafters"
	echo "results, CSV and plot: $out"
	exit
fi
modes=auto,linear,b4,b8,b16,b32,adaptive
bin/ddflash bench --modes "$modes" --concurrency 1,4 --max-tokens 96 --repeats 16 --warmup 1 --interleave \
	--workloads models/default/heldout.jsonl --raw --out "$out/heldout" "$@"
bin/ddflash bench --modes "$modes" --concurrency 1,4 --max-tokens 96 --repeats 40 --warmup 1 --interleave \
	--workloads chat,fibonacci --out "$out/chat-code" "$@"
bin/ddflash bench verify "$out/heldout"
bin/ddflash bench verify "$out/chat-code"
bin/ddflash bench report --out "$out/report" "$out/heldout" "$out/chat-code"
echo "results, CSV and plot: $out"
