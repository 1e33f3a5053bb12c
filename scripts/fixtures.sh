#!/usr/bin/env bash
# Reproduces the committed fixtures from scratch, with fixed seeds:
#   engine/testdata/golden-tiny/  float64 reference logits for a tiny random checkpoint (seconds),
#                                 and golden-tiny-fp8/, the same in FP8 (ddflash quantize)
#   dflash/testdata/golden-published-layout/  a random drafter in the published Qwen3.6-27B-DFlash
#                                 layer layout for golden-tiny, and its float64 draft logits (seconds)
#   models/default/               the trained tiny target + DFlash drafter, and eval.json (about
#                                 an hour of CPU: target ~30 min, drafter ~35 min, evaluation)
# Usage: scripts/fixtures.sh [golden|all]   (default all)
# Intermediate files go to $DDFLASH_TRAIN_CACHE/tiny (default /var/tmp/ddflash-train). Set
# DDFLASH_TORCH_THREADS=2 on an otherwise idle 2-core machine; the default, 1, is faster on
# cores shared with other jobs. Other thread counts can change the trained weights slightly.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/train-deps.sh

# Debian's python: another python3 earlier on PATH cannot import Debian's torch.
python=/usr/bin/python3
$python tools/reference/make_golden.py
# golden-tiny in Qwen's FP8 layout (only its weights and config.json: the README stays).
fp8tmp=$(mktemp -d)
go run ./cmd/ddflash quantize --in engine/testdata/golden-tiny --out "$fp8tmp"
cp "$fp8tmp/config.json" "$fp8tmp/model.safetensors" engine/testdata/golden-tiny-fp8/
rm -rf "$fp8tmp"
$python tools/reference/make_golden_fp8.py
$python tools/reference/make_layout_golden.py
if [ "${1:-all}" = golden ]; then
	exit 0
fi
$python tools/train/train_target.py
$python tools/train/train_draft.py
$python tools/train/evaluate.py
$python tools/reference/make_default_goldens.py
