#!/usr/bin/python3
"""Writes golden.json for the MTP golden (engine/testdata/golden-mtp): float64 draft logits of
the checkpoint's MTP head (tools/reference/mtp.py) on the checkpoint in that directory, which
`ddflash testmodel --preset tiny --mtp --dtype bf16 --seed 7 --out engine/testdata/golden-mtp`
writes.

Usage: make_mtp_golden.py [DIR]   (default engine/testdata/golden-mtp)
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mtp  # noqa: E402
import qwen36  # noqa: E402
from safetensors_io import write_golden  # noqa: E402

STEPS = 4
# (committed tokens, anchor): a one-token prompt and a longer one that crosses KV pages.
CASES = (([17], 42), ([5, 99, 23, 7, 140, 61, 3, 88, 210, 19, 47, 150, 9, 33, 71, 260, 12, 180, 64], 101))


def valid_vocab(directory):
    """The real token ids (the engine's ValidVocab): one past the tokenizer's largest id."""
    with open(os.path.join(directory, "tokenizer.json")) as f:
        tok = json.load(f)
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "engine/testdata/golden-mtp"
    cfg, target = qwen36.load_checkpoint(directory)
    head = mtp.load_mtp(directory)
    valid = valid_vocab(directory)
    cases, float32_diff = [], 0.0
    for ids, anchor in CASES:
        logits, tokens = mtp.draft(cfg, target, head, ids, anchor, STEPS, valid)
        # How far a float32 run of the same reference lands: a floor for the test's tolerance.
        t32 = {k: v.to(torch.float32) for k, v in target.items()}
        h32 = {k: v.to(torch.float32) for k, v in head.items()}
        logits32, _ = mtp.draft(cfg, t32, h32, ids, anchor, STEPS, valid)
        float32_diff = max(float32_diff, float((logits32.double() - logits).abs().max()))
        cases.append({"ids": ids, "anchor": anchor, "tokens": tokens, "logits": logits.tolist()})
    write_golden(os.path.join(directory, "golden.json"),
                 {"steps": STEPS, "valid_vocab": valid, "cases": cases, "checks": {"float32_max_abs_diff": float32_diff}})
    print(f"wrote {directory}/golden.json: {len(cases)} drafts of {STEPS} steps; float32 run within {float32_diff:.2e}")


if __name__ == "__main__":
    main()
