#!/usr/bin/python3
"""Writes the golden-tiny fixture: a small random Qwen3.5-layout checkpoint (8 layers,
3×GDN + 1×gated attention twice) and golden.json with float64 reference logits and per-layer
hidden states for three fixed token sequences.

Usage: make_golden.py [OUTPUT_DIR]   (default engine/testdata/golden-tiny)
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash  # noqa: E402
import qwen36  # noqa: E402
from safetensors_io import write_golden  # noqa: E402

SEED = 20260
SEQUENCE_LENGTHS = (1, 7, 40)
MAX_SEQUENCE_ID = 300  # ids 300..319 stay unused, like a real vocabulary's padding rows
EOS_TOKEN_ID = 300
FLOAT32_TENSORS = ("A_log", "dt_bias")  # stored as F32, as some real checkpoints do, to mix dtypes

CONFIG = qwen36.TextConfig(
    hidden_size=64,
    layer_types=(qwen36.LINEAR,) * 3 + (qwen36.FULL,) + (qwen36.LINEAR,) * 3 + (qwen36.FULL,),
    intermediate_size=128,
    vocab_size=320,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    attn_output_gate=True,
    linear_key_heads=2,
    linear_value_heads=4,
    linear_key_dim=16,
    linear_value_dim=16,
    conv_kernel=4,
    rope_theta=10_000_000.0,
    partial_rotary_factor=0.25,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)

# A drafter for the golden target. Its head layout and RoPE theta differ from the target's so
# that mixing the two configs shows; mask id 319 lies in the unused id range.
DRAFT_CONFIG = dflash.DraftConfig(
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=96,
    rms_norm_eps=1e-6,
    rope_theta=10_000.0,
    block_size=16,
    mask_token_id=319,
    target_layer_ids=(1, 4, 7),
)
DRAFT_ANCHORS = (12, 24)  # in the 40-token sequence


def draft_golden(out_dir, target_cfg, target, ids, generator):
    """Writes the drafter (draft/); returns its float64 logits for a block at each anchor and
    how far a float32 run (target and drafter) lands from them."""
    draft_dir = os.path.join(out_dir, "draft")
    dflash.save_draft(
        draft_dir,
        dflash.draft_config_json(DRAFT_CONFIG, len(target_cfg.layer_types), target_cfg.vocab_size, 256),
        dflash.init_draft_weights(DRAFT_CONFIG, generator),
    )
    cfg, draft = dflash.load_draft(draft_dir)
    assert cfg == DRAFT_CONFIG, "draft config.json does not round-trip"
    draft32 = {name: t.to(torch.float32) for name, t in draft.items()}
    target32 = {name: t.to(torch.float32) for name, t in target.items()}
    features = dflash.target_features(qwen36.forward(target_cfg, target, torch.tensor([ids]))[1], cfg.target_layer_ids)
    features32 = dflash.target_features(qwen36.forward(target_cfg, target32, torch.tensor([ids]))[1], cfg.target_layer_ids)
    blocks, float32_diff = [], 0.0
    for anchor in DRAFT_ANCHORS:
        anchor_id = torch.tensor([ids[anchor]])
        logits = dflash.draft_block(cfg, draft, target["embed_tokens.weight"], target["lm_head.weight"], features[:, :anchor], anchor_id)
        logits32 = dflash.draft_block(cfg, draft32, target32["embed_tokens.weight"], target32["lm_head.weight"], features32[:, :anchor], anchor_id)
        float32_diff = max(float32_diff, (logits32.double() - logits).abs().max().item())
        blocks.append({"anchor": anchor, "block_ids": [ids[anchor]] + [cfg.mask_token_id] * (cfg.block_size - 1), "logits": logits[0].tolist()})
    return blocks, float32_diff


def check_chunked_matches_recurrent(generator):
    """The chunked delta rule must equal the token loop across several chunks (T=150, chunk
    64), from a nonzero initial state, in outputs and final state."""
    batch, time, heads, key_dim, value_dim = 2, 150, 4, 16, 24

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q, k = qwen36.l2_normalize(randn(batch, time, heads, key_dim)), qwen36.l2_normalize(randn(batch, time, heads, key_dim))
    v, state = randn(batch, time, heads, value_dim), randn(batch, heads, key_dim, value_dim)
    g = -torch.rand(batch, time, heads, generator=generator, dtype=torch.float64)
    beta = torch.rand(batch, time, heads, generator=generator, dtype=torch.float64)
    chunked, chunked_state = qwen36.delta_rule_chunked(q, k, v, g, beta, state)
    looped, looped_state = qwen36.delta_rule_recurrent(q, k, v, g, beta, state)
    diff = max((chunked - looped).abs().max().item(), (chunked_state - looped_state).abs().max().item())
    assert diff < 1e-12, f"chunked delta rule differs from the token loop by {diff}"
    return diff


def check_incremental_matches_full(cfg, weights, ids, full_logits, prefill):
    """Prefill (chunked) then one token at a time through the cache must give the full logits."""
    cache = qwen36.Cache()
    pieces = [qwen36.forward(cfg, weights, ids[:, :prefill], qwen36.delta_rule_chunked, cache)[0]]
    for t in range(prefill, ids.shape[1]):
        pieces.append(qwen36.forward(cfg, weights, ids[:, t:t + 1], qwen36.delta_rule_recurrent, cache)[0])
    diff = (torch.cat(pieces, 1) - full_logits).abs().max().item()
    assert diff < 1e-10, f"incremental decoding differs from the full forward by {diff}"
    return diff


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("engine", "testdata", "golden-tiny")
    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(SEED)
    cfg = CONFIG
    float32_names = {name for name in qwen36.weight_shapes(cfg) if name.split(".")[-1] in FLOAT32_TENSORS}
    qwen36.save_checkpoint(out_dir, qwen36.config_json(cfg, 256, EOS_TOKEN_ID), qwen36.init_weights(cfg, generator), float32_names)

    # Everything below reads the checkpoint back, so the golden reflects the stored BF16 values.
    loaded_cfg, weights = qwen36.load_checkpoint(out_dir)
    assert loaded_cfg == cfg, "config.json does not round-trip"
    sequences = [torch.randint(0, MAX_SEQUENCE_ID, (n,), generator=generator).tolist() for n in SEQUENCE_LENGTHS]
    rule_diff = check_chunked_matches_recurrent(generator)

    weights32 = {name: t.to(torch.float32) for name, t in weights.items()}
    records, model_rule_diff, incremental_diff, float32_logits_diff, float32_hidden_diff = [], 0.0, 0.0, 0.0, 0.0
    with torch.no_grad():
        for ids in sequences:
            batch = torch.tensor([ids])
            logits, hidden = qwen36.forward(cfg, weights, batch, qwen36.delta_rule_recurrent)
            chunked_logits, _ = qwen36.forward(cfg, weights, batch, qwen36.delta_rule_chunked)
            logits32, hidden32 = qwen36.forward(cfg, weights32, batch, qwen36.delta_rule_recurrent)
            model_rule_diff = max(model_rule_diff, (chunked_logits - logits).abs().max().item())
            float32_logits_diff = max(float32_logits_diff, (logits32.double() - logits).abs().max().item())
            float32_hidden_diff = max(float32_hidden_diff, max((a.double() - b).abs().max().item() for a, b in zip(hidden32, hidden)))
            records.append({"ids": ids, "logits": logits[0].tolist(), "hidden": [h[0].tolist() for h in hidden]})
            incremental_diff = max(incremental_diff, check_incremental_matches_full(cfg, weights, batch, logits, (len(ids) + 1) // 2))
        draft_blocks, float32_draft_diff = draft_golden(out_dir, cfg, weights, sequences[-1], generator)
    assert model_rule_diff < 1e-10, f"chunked and recurrent model logits differ by {model_rule_diff}"

    golden = {
        "generator": "tools/reference/make_golden.py (float64 reference tools/reference/qwen36.py)",
        "checkpoint": "config.json and model.safetensors in this directory (BF16; A_log and dt_bias F32)",
        "layout": {
            "logits": "[position][vocab], float64, a fresh request starting at position 0",
            "hidden": "[layer][position][hidden]: each decoder layer's output (residual stream, before the final norm)",
        },
        "checks": {
            "chunked_vs_recurrent_delta_rule_max_abs": rule_diff,
            "chunked_vs_recurrent_model_logits_max_abs": model_rule_diff,
            "incremental_vs_full_logits_max_abs": incremental_diff,
            "float32_reference_logits_max_abs": float32_logits_diff,
            "float32_reference_hidden_max_abs": float32_hidden_diff,
            "float32_reference_draft_logits_max_abs": float32_draft_diff,
        },
        "sequences": records,
        "draft": {
            "checkpoint": "draft/ (z-lab DFlash layout, BF16)",
            "sequence": len(records) - 1,
            "layout": "blocks[i].logits[row][vocab] for rows 1..block_size-1 of the block [ids[anchor], mask...] at "
                      "positions anchor..anchor+15, context = target features of positions 0..anchor-1, all keys visible",
            "blocks": draft_blocks,
        },
    }
    write_golden(os.path.join(out_dir, "golden.json"), golden)
    print(f"wrote {out_dir}: delta rule chunked-vs-loop {rule_diff:.2e}, model {model_rule_diff:.2e}, "
          f"incremental {incremental_diff:.2e}, "
          f"float32 vs float64: logits {float32_logits_diff:.2e}, hidden {float32_hidden_diff:.2e}, "
          f"draft logits {float32_draft_diff:.2e}")


if __name__ == "__main__":
    main()
