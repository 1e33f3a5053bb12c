"""Reference forward of a DFlash block-diffusion drafter in the z-lab layout
(docs/dflash-ddtree.md §1; z-lab dflash/model.py semantics).

The drafter is a stack of Qwen3 decoder layers (plain-weight RMSNorm, q_norm/k_norm, full
NeoX RoPE, no output gate). Its keys and values come from the fused target features of the
context (fc, then hidden_norm) followed by the block itself; its queries come from the block
[anchor, mask, …, mask]. It reuses the target's embedding and lm_head. Only non-causal
full_attention layers are implemented (the layer type of the tiny drafter trained here).
"""

import json
import math
import os
from dataclasses import dataclass

import torch

from qwen36 import apply_rope, attend, mlp
from safetensors_io import read_safetensors, write_safetensors


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple


def parse_draft_config(raw):
    dflash = raw.get("dflash_config", {})
    layer_types = raw.get("layer_types") or ["full_attention"] * raw["num_hidden_layers"]
    if any(t != "full_attention" for t in layer_types) or raw.get("is_causal"):
        raise ValueError(f"only non-causal full_attention drafter layers are supported, got {layer_types}")
    return DraftConfig(
        hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=raw["num_attention_heads"],
        num_kv_heads=raw["num_key_value_heads"],
        head_dim=raw["head_dim"],
        intermediate_size=raw["intermediate_size"],
        rms_norm_eps=raw["rms_norm_eps"],
        rope_theta=raw.get("rope_theta") or raw["rope_parameters"]["rope_theta"],
        block_size=dflash.get("block_size", raw.get("block_size", 16)),
        mask_token_id=dflash["mask_token_id"],
        target_layer_ids=tuple(dflash["target_layer_ids"]),
    )


def draft_config_json(cfg, num_target_layers, vocab_size, max_position_embeddings):
    """config.json as the z-lab drafters ship it: a Qwen3 config plus block_size and dflash_config."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
        "num_target_layers": num_target_layers,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "layer_types": ["full_attention"] * cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_position_embeddings,
        "sliding_window": None,
        "use_sliding_window": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "dtype": "bfloat16",
    }


def draft_weight_shapes(cfg):
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    attn_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {
        "fc.weight": (hidden, hidden * len(cfg.target_layer_ids)),
        "hidden_norm.weight": (hidden,),
        "norm.weight": (hidden,),
    }
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (attn_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, attn_dim),
            p + "self_attn.q_norm.weight": (cfg.head_dim,),
            p + "self_attn.k_norm.weight": (cfg.head_dim,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    return shapes


def init_draft_weights(cfg, generator):
    """Random weights with healthy activations: matrices N(0, 1/fan_in), norm weights near 1
    (not exactly 1, so a golden catches a norm that is skipped or read as 1+w)."""
    weights = {}
    for name, shape in draft_weight_shapes(cfg).items():
        if len(shape) == 1:
            weights[name] = 1 + 0.1 * torch.randn(shape, generator=generator)
        else:
            weights[name] = torch.randn(shape, generator=generator) / math.sqrt(shape[1])
    return weights


def save_draft(directory, config, weights):
    """Writes config.json and model.safetensors (BF16, z-lab names: no prefix, no embeddings)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(directory, "model.safetensors"), weights, {name: "BF16" for name in weights})


def load_draft(directory, dtype=torch.float64):
    with open(os.path.join(directory, "config.json")) as f:
        cfg = parse_draft_config(json.load(f))
    weights = read_safetensors(os.path.join(directory, "model.safetensors"))
    return cfg, {name: t.to(dtype) for name, t in weights.items()}


def rms_norm(x, weight, eps):
    """Qwen3 RMSNorm: plain weight (unlike the target's zero-centred norms)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def target_features(hidden, layer_ids):
    """Concatenates the tapped target layers' outputs, in target_layer_ids order."""
    return torch.cat([hidden[i] for i in layer_ids], -1)


def fuse_context(cfg, w, features):
    """Target features [B, C, taps·hidden] -> the context rows every drafter layer reads."""
    return rms_norm(features @ w["fc.weight"].T, w["hidden_norm.weight"], cfg.rms_norm_eps)


def draft_hidden(cfg, w, context, context_positions, block, block_positions, visible):
    """context [B, C, hidden] (fused), block [B, N, hidden] (embedded block tokens), positions
    [C] and [N], visible [N, C+N] (True where a block row may attend to a key). Returns the
    final-normed hidden states [B, N, hidden]; logits are these times the target lm_head."""
    batch, rows, _ = block.shape
    heads, kv_heads, dim, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    key_positions = torch.cat([context_positions, block_positions])
    x = block
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        u = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        keys_from = torch.cat([context, u], 1)  # context rows skip input_layernorm
        q = rms_norm((u @ w[p + "self_attn.q_proj.weight"].T).view(batch, rows, heads, dim), w[p + "self_attn.q_norm.weight"], eps)
        k = (keys_from @ w[p + "self_attn.k_proj.weight"].T).view(batch, -1, kv_heads, dim)
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        v = (keys_from @ w[p + "self_attn.v_proj.weight"].T).view(batch, -1, kv_heads, dim)
        q = apply_rope(q, block_positions, dim, cfg.rope_theta)
        k = apply_rope(k, key_positions, dim, cfg.rope_theta)
        x = x + attend(q, k, v, visible).reshape(batch, rows, heads * dim) @ w[p + "self_attn.o_proj.weight"].T
        x = x + mlp(w, p + "mlp.", rms_norm(x, w[p + "post_attention_layernorm.weight"], eps))
    return rms_norm(x, w["norm.weight"], eps)


def draft_block(cfg, w, embed, lm_head, features, anchor_ids):
    """One inference draft step: context = every position before the anchor (features
    [B, start, taps·hidden]), block [anchor, mask×(block_size−1)] at positions start…, all
    keys visible (non-causal). Returns logits [B, block_size−1, V] for the tokens after the anchor."""
    batch, start, _ = features.shape
    ids = torch.full((batch, cfg.block_size), cfg.mask_token_id)
    ids[:, 0] = anchor_ids
    visible = torch.ones(cfg.block_size, start + cfg.block_size, dtype=torch.bool)
    hidden = draft_hidden(
        cfg, w, fuse_context(cfg, w, features), torch.arange(start), embed[ids],
        torch.arange(start, start + cfg.block_size), visible,
    )
    return hidden[:, 1:] @ lm_head.T
