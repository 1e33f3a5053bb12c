#!/usr/bin/python3
"""Writes dflash/testdata/golden-dflash2: a random DFlash2 drafter laid out as the published
DFlash2 config (dflash/testdata/dflash2-config.json: architecture DFlash2DraftModel, every layer
sliding_attention with is_causal false, block_size 16 inside dflash_config, conv_kernel_size 2,
conv_group_size 16, selector_top_k 16, output_multiplier and final_logit_softcapping as published,
rope_parameters) at golden-tiny's widths (hidden 64: 4 conv groups; selector_rank 8), and float64
reference draft steps on golden-tiny's 40-token sequence: the unary logits, the selector's
candidates and edge scores, and its greedy path (tools/reference/qwen36.py for the target's
tapped hidden states, tools/reference/dflash2.py for the drafter).

Usage: make_dflash2_golden.py  (run from the repository root with Debian's python3)
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash  # noqa: E402
import dflash2  # noqa: E402
import qwen36  # noqa: E402
from safetensors_io import write_golden  # noqa: E402

PUBLISHED = os.path.join("dflash", "testdata", "dflash2-config.json")
TARGET = os.path.join("engine", "testdata", "golden-tiny")
OUT = os.path.join("dflash", "testdata", "golden-dflash2")
SEED = 352816
WINDOW = 8
RANK = 8
ANCHORS = (5, 30)
EMBEDDING_SCALE = 1.5  # scaled/: the same drafter with input_embedding_scale set (vLLM reads it; 1 when absent)
MARGIN = 2e-4  # the least gap at a top-K cut or a greedy choice, so float32 makes the same choices


def drafter_config(published, target_cfg):
    group = published["num_attention_heads"] // published["num_key_value_heads"]
    layers = published["num_hidden_layers"]
    return dflash.DraftConfig(
        hidden_size=target_cfg.hidden_size,
        num_layers=layers,
        num_heads=group,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=96,
        rms_norm_eps=published["rms_norm_eps"],
        rope_theta=float(published["rope_parameters"]["rope_theta"]),
        block_size=published["dflash_config"]["block_size"],
        mask_token_id=target_cfg.vocab_size - 1,
        target_layer_ids=dflash.build_target_layer_ids(len(target_cfg.layer_types), layers),
        layer_types=tuple(published["layer_types"]),
        sliding_window=WINDOW,
        causal=published["is_causal"],
    )


def config_json(cfg, v2, target_cfg):
    """The published DFlash2 config.json shape: block_size and the DFlash2 fields inside
    dflash_config (input_embedding_scale only when it is not 1), rope_parameters instead of
    rope_theta."""
    raw = dflash.draft_config_json(cfg, len(target_cfg.layer_types), target_cfg.vocab_size, 256)
    raw["architectures"] = [dflash2.V2_ARCHITECTURE]
    raw["dflash_config"]["block_size"] = raw.pop("block_size")
    raw["dflash_config"] |= {k: v for k, v in v2.items() if k != "input_embedding_scale" or v != 1.0}
    raw["rope_parameters"] = {"rope_theta": raw.pop("rope_theta"), "rope_type": "default"}
    del raw["rope_scaling"]
    return raw


def clear_margins(logits, scores, k):
    """Whether every top-k cut and every greedy choice is decided by more than MARGIN."""
    for values in logits:
        ordered = sorted(values.tolist(), reverse=True)
        if ordered[k - 1] - ordered[k] <= MARGIN:
            return False
    previous = 0
    for edges in scores:
        ordered = sorted(edges[previous].tolist(), reverse=True)
        if ordered[0] - ordered[1] <= MARGIN:
            return False
        previous = int(torch.argmax(edges[previous]))
    return True


def draft_steps(cfg, v2, target_cfg, target, ids, features, seed):
    """Writes the drafter made from seed and returns its reference draft steps, or None when a
    choice in them is a near tie."""
    generator = torch.Generator().manual_seed(seed)
    weights = dflash.init_draft_weights(cfg, generator) | dflash2.init_v2_weights(cfg, v2, target_cfg.vocab_size, generator)
    draft_dir = os.path.join(OUT, "draft")
    dflash.save_draft(draft_dir, config_json(cfg, v2, target_cfg), weights)
    # Everything below reads the drafter back, so the golden reflects the stored BF16 values.
    loaded_cfg, draft = dflash.load_draft(draft_dir)
    with open(os.path.join(draft_dir, "config.json")) as f:
        loaded_v2 = dflash2.v2_fields(json.load(f))
    assert loaded_cfg == cfg and loaded_v2 == v2, "draft config.json does not round-trip"
    scaled = v2 | {"input_embedding_scale": EMBEDDING_SCALE}
    blocks = {"": [], "scaled": []}
    with torch.no_grad():
        for name, settings in (("", v2), ("scaled", scaled)):
            for anchor in ANCHORS:
                logits, candidates, scores, path = dflash2.draft_block(
                    cfg, settings, draft, target["embed_tokens.weight"], target["lm_head.weight"], features[:, :anchor],
                    ids[anchor], target_cfg.vocab_size)
                if not clear_margins(logits, scores, v2["selector_top_k"]):
                    return None
                blocks[name].append({
                    "anchor": anchor,
                    "logits": [[round(v, 7) for v in row] for row in logits.tolist()],
                    "candidates": candidates,
                    "scores": [[[round(v, 7) for v in r] for r in edges.tolist()] for edges in scores],
                    "path": path,
                })
    os.makedirs(os.path.join(OUT, "scaled"), exist_ok=True)
    with open(os.path.join(OUT, "scaled", "config.json"), "w") as f:
        json.dump(config_json(cfg, scaled, target_cfg), f, indent=2)
        f.write("\n")
    return blocks


def main():
    with open(PUBLISHED) as f:
        published = json.load(f)
    target_cfg, target = qwen36.load_checkpoint(TARGET)
    cfg = drafter_config(published, target_cfg)
    v2 = dflash2.v2_fields(published) | {"selector_rank": RANK}
    with open(os.path.join(TARGET, "golden.json")) as f:
        ids = json.load(f)["sequences"][-1]["ids"]
    with torch.no_grad():
        features = qwen36.forward(target_cfg, target, torch.tensor([ids]))[1]
    features = dflash.target_features(features, cfg.target_layer_ids)
    # The first seed from SEED on whose draft steps no top-k cut or greedy choice is a near tie.
    for seed in range(SEED, SEED + 100):
        blocks = draft_steps(cfg, v2, target_cfg, target, ids, features, seed)
        if blocks is not None:
            break
    else:
        raise SystemExit(f"every seed in [{SEED}, {SEED + 100}) has a near tie")
    write_golden(os.path.join(OUT, "golden.json"), {
        "generator": "tools/reference/make_dflash2_golden.py (float64 references of the target and the DFlash2 drafter)",
        "target": "engine/testdata/golden-tiny",
        "draft": "draft/ (published DFlash2 layout, BF16)",
        "seed": seed,
        "ids": ids,
        "layout": "blocks[i]: the block [ids[anchor], mask...] at positions anchor..anchor+15 with context = the target's "
                  "tapped layer outputs at positions 0..anchor-1; logits[row][vocab] the unary logits of rows 1..15 "
                  "(lm_head · output_multiplier, soft-capped); candidates[row][k] the top-16 token ids, descending; "
                  "scores[row][p][k] the edge score of candidate k after predecessor p (row 0: the anchor alone; "
                  "else candidate p of the previous row); path the greedy walk's tokens; scaled.blocks the same "
                  f"with scaled/config.json (input_embedding_scale {EMBEDDING_SCALE}) and draft/'s weights",
        "blocks": blocks[""],
        "scaled": {"blocks": blocks["scaled"]},
    })
    print(f"wrote {OUT}: seed {seed}, taps {cfg.target_layer_ids}, paths {[b['path'] for b in blocks['']]}")


if __name__ == "__main__":
    main()
