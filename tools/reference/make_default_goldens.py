#!/usr/bin/python3
"""Writes the goldens of the trained default pair, from the float64 references, on held-out
text from models/default/eval.json:
- models/testdata/golden-default.json: the target's logits at every position of 64 tokens
  (qwen36.py, the training code's own math);
- dflash/testdata/golden-default-draft.json: the drafter's logits for one draft step
  (qwen36.py for the target's tapped hidden states, dflash.py for the drafter).

Usage: make_default_goldens.py  (run from the repository root with Debian's python3)
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash  # noqa: E402
import qwen36  # noqa: E402
from safetensors_io import write_golden  # noqa: E402

CONTEXT = 40  # committed tokens before the anchor
TARGET_TOKENS = 64


def rounded(rows):
    return [[round(v, 6) for v in row] for row in rows]


def main():
    with open("models/default/eval.json") as f:
        prompts = json.load(f)["prompts"]
    target_cfg, target = qwen36.load_checkpoint("models/default/target")
    draft_cfg, draft = dflash.load_draft("models/default/draft")

    held_out = (prompts[1]["prompt_ids"] + prompts[1]["greedy_ids"])[:TARGET_TOKENS]
    with torch.no_grad():
        logits, _ = qwen36.forward(target_cfg, target, torch.tensor([held_out]))
    write_golden("models/testdata/golden-default.json", {
        "generator": "tools/reference/make_default_goldens.py (float64, the training model's math)",
        "ids": held_out,
        "logits": rounded(logits[0].tolist()),
    }, newline=False)

    ids = (prompts[0]["prompt_ids"] + prompts[0]["greedy_ids"])[: CONTEXT + 1]
    with torch.no_grad():
        _, hidden = qwen36.forward(target_cfg, target, torch.tensor([ids[:CONTEXT]]))
        features = dflash.target_features(hidden, draft_cfg.target_layer_ids)
        logits = dflash.draft_block(
            draft_cfg, draft, target["embed_tokens.weight"], target["lm_head.weight"], features, torch.tensor([ids[CONTEXT]]),
        )
    write_golden("dflash/testdata/golden-default-draft.json", {
        "generator": "tools/reference/make_default_goldens.py (float64 references of the target and the drafter)",
        "context": ids[:CONTEXT],
        "anchor": ids[CONTEXT],
        "logits": rounded(logits[0].tolist()),
    }, newline=False)


if __name__ == "__main__":
    main()
