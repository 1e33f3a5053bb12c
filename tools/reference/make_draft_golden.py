#!/usr/bin/python3
"""Writes dflash/testdata/golden-default-draft.json: the default drafter's logits for one
draft step, from the float64 references (qwen36.py for the target's tapped hidden states,
dflash.py for the drafter), on held-out text from models/default/eval.json.

Usage: make_draft_golden.py  (run from the repository root with Debian's python3)
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash  # noqa: E402
import qwen36  # noqa: E402

CONTEXT = 40  # committed tokens before the anchor


def main():
    with open("models/default/eval.json") as f:
        prompt = json.load(f)["prompts"][0]
    ids = (prompt["prompt_ids"] + prompt["greedy_ids"])[: CONTEXT + 1]
    target_cfg, target = qwen36.load_checkpoint("models/default/target")
    draft_cfg, draft = dflash.load_draft("models/default/draft")
    with torch.no_grad():
        _, hidden = qwen36.forward(target_cfg, target, torch.tensor([ids[:CONTEXT]]))
        features = dflash.target_features(hidden, draft_cfg.target_layer_ids)
        logits = dflash.draft_block(
            draft_cfg, draft, target["embed_tokens.weight"], target["lm_head.weight"], features, torch.tensor([ids[CONTEXT]]),
        )
    out = {
        "generator": "tools/reference/make_draft_golden.py (float64 references of the target and the drafter)",
        "context": ids[:CONTEXT],
        "anchor": ids[CONTEXT],
        "logits": [[round(v, 6) for v in row] for row in logits[0].tolist()],
    }
    os.makedirs("dflash/testdata", exist_ok=True)
    with open("dflash/testdata/golden-default-draft.json", "w") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
