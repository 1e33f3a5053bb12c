#!/usr/bin/env bash
# Trains the demo pair, models/demo/ (tools/train/presets.py "demo": a 64M-parameter target,
# 128 MB in BF16, and its DFlash drafter), from scratch on the CPU: target, then the greedy
# continuations the drafter learns from, then the drafter, then the held-out evaluation
# (eval.json, heldout.jsonl). Each stage is skipped when its output exists and resumes from
# its checkpoints under $DDFLASH_TRAIN_CACHE/demo (default /var/tmp/ddflash-train/demo), so
# after an interruption the same command continues where the run stopped. Hours of CPU.
# Usage: scripts/train-demo.sh     (in the background: nohup nice -n 10 scripts/train-demo.sh >LOG 2>&1 &)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/train-deps.sh
python=/usr/bin/python3 # Debian's: another python3 earlier on PATH cannot import Debian's torch
export DDFLASH_TORCH_THREADS=${DDFLASH_TORCH_THREADS:-2}

# Each script writes its last file only when everything before it is complete.
[ -f models/demo/target/model.safetensors.index.json ] || $python tools/train/train_target.py --preset demo --resume
[ -f models/demo/draft/model.safetensors ] || $python tools/train/train_draft.py --preset demo --resume
[ -f models/demo/heldout.jsonl ] || $python tools/train/evaluate.py --preset demo
# The target's MTP head (docs/mtp.md), written into models/demo/target/: done once its index names it.
grep -qs '"mtp.fc.weight"' models/demo/target/model.safetensors.index.json || $python tools/train/train_mtp.py --preset demo --resume
echo "demo pair trained: models/demo/ (metrics in ${DDFLASH_TRAIN_CACHE:-/var/tmp/ddflash-train}/demo/*_metrics.json)"
