"""Reference forward of a DFlash block-diffusion drafter in the z-lab layout
(docs/dflash-ddtree.md §1; z-lab dflash/model.py semantics).

The drafter is a stack of Qwen3 decoder layers (plain-weight RMSNorm, q_norm/k_norm, full
NeoX RoPE, no output gate). Its keys and values come from the fused target features of the
context (fc, then hidden_norm) followed by the block itself; its queries come from the block
[anchor, mask, …, mask]. It reuses the target's embedding and lm_head. Layers are
full_attention (non-causal: every key visible) or sliding_attention (causal, and keys a
sliding_window or more before the query hidden), unless is_causal / dflash_config.causal sets
every layer's causality (docs/dflash-ddtree.md §1.4).
"""

import json
import math
import os
from dataclasses import dataclass

import torch

from qwen36 import apply_rope, attend, mlp
from safetensors_io import read_safetensors, write_safetensors


FULL, SLIDING = "full_attention", "sliding_attention"


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
    layer_types: tuple = None  # "full_attention" or "sliding_attention" per layer; None: all full
    sliding_window: int = None  # required when a layer slides
    causal: bool = None  # is_causal (dflash_config.causal) when the config sets it

    def __post_init__(self):
        if self.layer_types is None:
            object.__setattr__(self, "layer_types", (FULL,) * self.num_layers)
        if len(self.layer_types) != self.num_layers or not set(self.layer_types) <= {FULL, SLIDING}:
            raise ValueError(f"layer_types {self.layer_types}: want {self.num_layers} of {FULL}, {SLIDING}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_attention layers need a sliding_window")


def build_target_layer_ids(num_target_layers, num_draft_layers):
    """z-lab's default taps: the middle target layer for one draft layer, else spread evenly over
    [1, num_target_layers − 3] (Python's round)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    span = end - start
    return tuple(round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


def parse_draft_config(raw):
    dflash = raw.get("dflash_config", {})
    layer_types = raw.get("layer_types") or [FULL] * raw["num_hidden_layers"]
    causal = dflash.get("causal", raw.get("is_causal"))
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
        layer_types=tuple(layer_types),
        sliding_window=raw.get("sliding_window") if SLIDING in layer_types else None,
        causal=causal,
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
        "layer_types": list(cfg.layer_types),
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_position_embeddings,
        "sliding_window": cfg.sliding_window,
        "use_sliding_window": cfg.sliding_window is not None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "dtype": "bfloat16",
    } | ({} if cfg.causal is None else {"is_causal": cfg.causal})


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


def layer_visible(cfg, layer, query_positions, key_positions):
    """[N, K], True where a query at query_positions[n] may attend to the key at
    key_positions[k] in the given layer: full_attention layers are non-causal, sliding_attention
    layers causal, unless cfg.causal sets it; sliding layers see keys less than sliding_window
    positions away (before the query; on either side when non-causal)."""
    sliding = cfg.layer_types[layer] == SLIDING
    causal = sliding if cfg.causal is None else cfg.causal
    distance = query_positions[:, None] - key_positions[None, :]
    visible = torch.ones(distance.shape, dtype=torch.bool)
    if causal:
        visible &= distance >= 0
    if sliding:
        visible &= distance.abs() < cfg.sliding_window
    return visible


def draft_hidden(cfg, w, context, context_positions, block, block_positions, visible):
    """context [B, C, hidden] (fused), block [B, N, hidden] (embedded block tokens), positions
    [C] and [N], visible [N, C+N] (True where a block row may attend to a key), one for every
    layer or a list with one per layer. Returns the final-normed hidden states [B, N, hidden];
    logits are these times the target lm_head."""
    batch, rows, _ = block.shape
    heads, kv_heads, dim, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    key_positions = torch.cat([context_positions, block_positions])
    masks = visible if isinstance(visible, (list, tuple)) else [visible] * cfg.num_layers
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
        x = x + attend(q, k, v, masks[i]).reshape(batch, rows, heads * dim) @ w[p + "self_attn.o_proj.weight"].T
        x = x + mlp(w, p + "mlp.", rms_norm(x, w[p + "post_attention_layernorm.weight"], eps))
    return rms_norm(x, w["norm.weight"], eps)


def draft_block(cfg, w, embed, lm_head, features, anchor_ids):
    """One inference draft step: context = every position before the anchor (features
    [B, start, taps·hidden]), block [anchor, mask×(block_size−1)] at positions start…, keys
    visible per layer_visible. Returns logits [B, block_size−1, V] for the tokens after the anchor."""
    batch, start, _ = features.shape
    ids = torch.full((batch, cfg.block_size), cfg.mask_token_id)
    ids[:, 0] = anchor_ids
    block_positions = torch.arange(start, start + cfg.block_size)
    key_positions = torch.arange(start + cfg.block_size)
    visible = [layer_visible(cfg, i, block_positions, key_positions) for i in range(cfg.num_layers)]
    hidden = draft_hidden(
        cfg, w, fuse_context(cfg, w, features), torch.arange(start), embed[ids], block_positions, visible,
    )
    return hidden[:, 1:] @ lm_head.T
