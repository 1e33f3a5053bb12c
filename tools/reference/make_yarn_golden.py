#!/usr/bin/python3
"""Writes engine/testdata/golden-yarn: golden-tiny's weights run with YaRN RoPE, given as a legacy
rope_scaling block (which replaces rope_parameters, as in transformers). config.json and golden.json
(float64 reference logits of golden-tiny's sequences) only: the test reads the weights from
golden-tiny.

Theta 100 and an original context of 256 put golden-tiny's two rotary pairs on both sides of YaRN's
ramp with these sequence lengths: pair 0 (1 rad/position) is kept, pair 1 (0.1 rad/position) is
half divided by the factor, and cos and sin carry the attention factor 0.1·ln 4 + 1.

Usage: make_yarn_golden.py  (run from the repository root with Debian's python3)
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen36  # noqa: E402
from safetensors_io import write_golden  # noqa: E402

TINY = os.path.join("engine", "testdata", "golden-tiny")
OUT = os.path.join("engine", "testdata", "golden-yarn")
ROPE_SCALING = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                "rope_theta": 100.0, "partial_rotary_factor": 0.25}


def main():
    with open(os.path.join(TINY, "config.json")) as f:
        config = json.load(f)
    text = config["text_config"]
    del text["rope_parameters"]
    text["rope_scaling"] = ROPE_SCALING
    text["max_position_embeddings"] = 1024
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")

    cfg = qwen36.parse_config(config)
    _, weights = qwen36.load_checkpoint(TINY)
    assert cfg.yarn is not None and cfg.rope_theta == 100.0 and cfg.rotary_dim == 4
    inv_freq, scale = qwen36.rope_frequencies(cfg.rotary_dim, cfg.rope_theta, cfg.yarn)
    with open(os.path.join(TINY, "golden.json")) as f:
        sequences = [s["ids"] for s in json.load(f)["sequences"]]
    records = []
    with torch.no_grad():
        for ids in sequences:
            logits, _ = qwen36.forward(cfg, weights, torch.tensor([ids]), qwen36.delta_rule_recurrent)
            records.append({"ids": ids, "logits": logits[0].tolist()})
    golden = {
        "generator": "tools/reference/make_yarn_golden.py (float64 reference tools/reference/qwen36.py)",
        "checkpoint": "config.json in this directory, weights from ../golden-tiny/model.safetensors",
        "rope": {"inv_freq": inv_freq.tolist(), "scale": scale},
        "layout": {"logits": "[position][vocab], float64, a fresh request starting at position 0"},
        "sequences": records,
    }
    write_golden(os.path.join(OUT, "golden.json"), golden)
    print(f"wrote {OUT}: inv_freq {inv_freq.tolist()}, scale {scale}")


if __name__ == "__main__":
    main()
