#!/usr/bin/python3
"""Writes dflash/testdata/golden-published-layout: a random DFlash drafter with the layer layout
of z-lab's Qwen3.6-27B-DFlash (its config's layer_types, 4 sliding_attention + 1 full_attention,
block size, norm eps and RoPE theta, read from dflash/testdata/qwen3.6-27b-dflash.config.subset.json)
at small widths, for the golden-tiny target, and float64 reference logits of draft steps on
golden-tiny's 40-token sequence (tools/reference/qwen36.py for the target's tapped hidden states,
tools/reference/dflash.py for the drafter).

The widths follow golden-tiny (hidden 64, vocabulary 320, mask id 319 in its unused ids); the
heads keep the published 4:1 grouping; the taps are z-lab's default rule for 5 draft layers over
golden-tiny's 8 layers, the rule that gives the published [1, 16, 31, 46, 61] over 64. The window
(8) is shorter than the context of the second anchor and than the block, so the sliding layers'
window and causality both show. noncausal/ holds the same drafter's config with is_causal false
(every layer non-causal, the sliding layers' window on both sides of a query); its weights are
draft/'s.

Usage: make_layout_golden.py  (run from the repository root with Debian's python3)
"""

import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash  # noqa: E402
import qwen36  # noqa: E402
from safetensors_io import write_golden  # noqa: E402

PUBLISHED = os.path.join("dflash", "testdata", "qwen3.6-27b-dflash.config.subset.json")
TARGET = os.path.join("engine", "testdata", "golden-tiny")
OUT = os.path.join("dflash", "testdata", "golden-published-layout")
SEED = 36275
WINDOW = 8
ANCHORS = (5, 30)  # in golden-tiny's 40-token sequence: context within and beyond the window


def drafter_config(published, target_cfg):
    assert dflash.build_target_layer_ids(published["num_target_layers"], published["num_hidden_layers"]) == \
        tuple(published["dflash_config"]["target_layer_ids"]), "the default tap rule does not give the published taps"
    group = published["num_attention_heads"] // published["num_key_value_heads"]
    return dflash.DraftConfig(
        hidden_size=target_cfg.hidden_size,
        num_layers=published["num_hidden_layers"],
        num_heads=group,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=96,
        rms_norm_eps=published["rms_norm_eps"],
        rope_theta=float(published["rope_theta"]),
        block_size=published["block_size"],
        mask_token_id=target_cfg.vocab_size - 1,
        target_layer_ids=dflash.build_target_layer_ids(len(target_cfg.layer_types), published["num_hidden_layers"]),
        layer_types=tuple(published["layer_types"]),
        sliding_window=WINDOW,
    )


def main():
    with open(PUBLISHED) as f:
        published = json.load(f)
    target_cfg, target = qwen36.load_checkpoint(TARGET)
    cfg = drafter_config(published, target_cfg)
    generator = torch.Generator().manual_seed(SEED)
    draft_dir = os.path.join(OUT, "draft")
    dflash.save_draft(
        draft_dir,
        dflash.draft_config_json(cfg, len(target_cfg.layer_types), target_cfg.vocab_size, 256),
        dflash.init_draft_weights(cfg, generator),
    )
    # Everything below reads the drafter back, so the golden reflects the stored BF16 values.
    loaded_cfg, draft = dflash.load_draft(draft_dir)
    assert loaded_cfg == cfg, "draft config.json does not round-trip"
    with open(os.path.join(TARGET, "golden.json")) as f:
        ids = json.load(f)["sequences"][-1]["ids"]
    assert len(ids) == 40
    # The same weights with every layer non-causal: only its config.json is written.
    noncausal = dataclasses.replace(cfg, causal=False)
    os.makedirs(os.path.join(OUT, "noncausal"), exist_ok=True)
    with open(os.path.join(OUT, "noncausal", "config.json"), "w") as f:
        json.dump(dflash.draft_config_json(noncausal, len(target_cfg.layer_types), target_cfg.vocab_size, 256), f, indent=2)
        f.write("\n")
    draft32 = {name: t.to(torch.float32) for name, t in draft.items()}
    target32 = {name: t.to(torch.float32) for name, t in target.items()}
    float32_diff = 0.0

    def steps(cfg):
        nonlocal float32_diff
        blocks = []
        for anchor in ANCHORS:
            anchor_id = torch.tensor([ids[anchor]])
            logits = dflash.draft_block(cfg, draft, target["embed_tokens.weight"], target["lm_head.weight"], features[:, :anchor], anchor_id)
            logits32 = dflash.draft_block(cfg, draft32, target32["embed_tokens.weight"], target32["lm_head.weight"], features32[:, :anchor], anchor_id)
            float32_diff = max(float32_diff, (logits32.double() - logits).abs().max().item())
            blocks.append({"anchor": anchor, "logits": [[round(v, 7) for v in row] for row in logits[0].tolist()]})
        return blocks

    with torch.no_grad():
        features = dflash.target_features(qwen36.forward(target_cfg, target, torch.tensor([ids]))[1], cfg.target_layer_ids)
        features32 = dflash.target_features(qwen36.forward(target_cfg, target32, torch.tensor([ids]))[1], cfg.target_layer_ids)
        blocks, noncausal_blocks = steps(cfg), steps(noncausal)
    write_golden(os.path.join(OUT, "golden.json"), {
        "generator": "tools/reference/make_layout_golden.py (float64 references of the target and the drafter)",
        "target": "engine/testdata/golden-tiny",
        "draft": "draft/ (z-lab DFlash layout, BF16): layer_types " + ", ".join(cfg.layer_types) + f", sliding_window {WINDOW}",
        "ids": ids,
        "layout": "blocks[i].logits[row][vocab] for rows 1..block_size-1 of the block [ids[anchor], mask...] at positions "
                  "anchor..anchor+15, context = the target's tapped layer outputs at positions 0..anchor-1; sliding layers "
                  "causal with the window, the full layer non-causal; noncausal.blocks the same with noncausal/config.json "
                  "(is_causal false: every layer non-causal, the window on both sides of a query) and draft/'s weights",
        "checks": {"float32_reference_draft_logits_max_abs": float32_diff},
        "blocks": blocks,
        "noncausal": {"blocks": noncausal_blocks},
    })
    print(f"wrote {OUT}: taps {cfg.target_layer_ids}, float32 vs float64 draft logits {float32_diff:.2e}")

if __name__ == "__main__":
    main()
