#!/usr/bin/python3
"""Reference forward of the Qwen3.5/3.6 hybrid text model (Gated DeltaNet + gated full
attention), written from the formulas in docs/qwen36-model.md (HF modeling_qwen3_5.py
semantics). It reads HF-layout checkpoints and runs in float64 by default.

The functions take batched inputs ([batch, time, ...]) and any float dtype, so the training
tools reuse them (float32, autograd) and the trained model has exactly this math.

Usage: qwen36.py CHECKPOINT_DIR --ids 1,2,3 [--dump-hidden] [--delta-rule recurrent]
prints JSON {"ids", "logits": [position][vocab], "hidden": [layer][position][hidden]}.
"hidden" is each decoder layer's output (the residual stream, before the final norm).
"""

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read_header, read_safetensors, write_safetensors  # noqa: E402

LINEAR = "linear_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class YaRN:
    """transformers' "yarn" RoPE scaling (arXiv 2309.00071): see rope_frequencies."""
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = None
    mscale: float = None
    mscale_all_dim: float = None
    truncate: bool = True


@dataclass(frozen=True)
class TextConfig:
    hidden_size: int
    layer_types: tuple
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attn_output_gate: bool
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    conv_kernel: int
    rope_theta: float
    partial_rotary_factor: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    yarn: YaRN = None

    @property
    def rotary_dim(self):
        return int(self.head_dim * self.partial_rotary_factor)


def parse_config(raw):
    """Accepts the multimodal wrapper (model_type qwen3_5, fields under text_config) or a
    flat qwen3_5_text config."""
    if raw["model_type"] == "qwen3_5":
        text = raw["text_config"]
        tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    elif raw["model_type"] == "qwen3_5_text":
        text = raw
        tie = raw.get("tie_word_embeddings", False)
    else:
        raise ValueError(f"unsupported model_type {raw['model_type']!r}")
    num_layers = text["num_hidden_layers"]
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = text["full_attention_interval"]
        layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
    if len(layer_types) != num_layers:
        raise ValueError(f"{len(layer_types)} layer_types for {num_layers} layers")
    # As transformers: a legacy rope_scaling object replaces rope_parameters; rope_theta falls
    # back to the top level, then 10000; a top-level partial_rotary_factor wins; the Qwen3.5 text
    # config's defaults fill head_dim (256) and the rotary fraction (0.25).
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    yarn = None
    if rope_type == "yarn":
        yarn = YaRN(
            factor=float(rope["factor"]),
            original_max_position_embeddings=rope.get("original_max_position_embeddings", text["max_position_embeddings"]),
            beta_fast=rope.get("beta_fast") or 32.0,
            beta_slow=rope.get("beta_slow") or 1.0,
            attention_factor=rope.get("attention_factor"),
            mscale=rope.get("mscale"),
            mscale_all_dim=rope.get("mscale_all_dim"),
            truncate=rope.get("truncate", True),
        )
    return TextConfig(
        hidden_size=text["hidden_size"],
        layer_types=tuple(layer_types),
        intermediate_size=text["intermediate_size"],
        vocab_size=text["vocab_size"],
        num_heads=text["num_attention_heads"],
        num_kv_heads=text["num_key_value_heads"],
        head_dim=text.get("head_dim", 256),
        attn_output_gate=text.get("attn_output_gate", True),
        linear_key_heads=text["linear_num_key_heads"],
        linear_value_heads=text["linear_num_value_heads"],
        linear_key_dim=text["linear_key_head_dim"],
        linear_value_dim=text["linear_value_head_dim"],
        conv_kernel=text["linear_conv_kernel_dim"],
        rope_theta=rope.get("rope_theta", text.get("rope_theta", 10000.0)),
        partial_rotary_factor=text.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25)),
        rms_norm_eps=text["rms_norm_eps"],
        tie_word_embeddings=tie,
        yarn=yarn,
    )


def weight_shapes(cfg):
    """{short name: shape} of every text-model tensor, in HF [out, in] layout."""
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    shapes = {"embed_tokens.weight": (cfg.vocab_size, hidden), "norm.weight": (hidden,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, hidden)
    key_dim = cfg.linear_key_heads * cfg.linear_key_dim
    value_dim = cfg.linear_value_heads * cfg.linear_value_dim
    attn_dim = cfg.num_heads * cfg.head_dim
    kv_dim = cfg.num_kv_heads * cfg.head_dim
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        if kind == FULL:
            a = p + "self_attn."
            shapes[a + "q_proj.weight"] = (attn_dim * (2 if cfg.attn_output_gate else 1), hidden)
            shapes[a + "k_proj.weight"] = (kv_dim, hidden)
            shapes[a + "v_proj.weight"] = (kv_dim, hidden)
            shapes[a + "o_proj.weight"] = (hidden, attn_dim)
            shapes[a + "q_norm.weight"] = (cfg.head_dim,)
            shapes[a + "k_norm.weight"] = (cfg.head_dim,)
        else:
            a = p + "linear_attn."
            conv_dim = 2 * key_dim + value_dim
            shapes[a + "in_proj_qkv.weight"] = (conv_dim, hidden)
            shapes[a + "in_proj_z.weight"] = (value_dim, hidden)
            shapes[a + "in_proj_b.weight"] = (cfg.linear_value_heads, hidden)
            shapes[a + "in_proj_a.weight"] = (cfg.linear_value_heads, hidden)
            shapes[a + "conv1d.weight"] = (conv_dim, 1, cfg.conv_kernel)
            shapes[a + "dt_bias"] = (cfg.linear_value_heads,)
            shapes[a + "A_log"] = (cfg.linear_value_heads,)
            shapes[a + "norm.weight"] = (cfg.linear_value_dim,)
            shapes[a + "out_proj.weight"] = (hidden, value_dim)
    return shapes


def init_weights(cfg, generator):
    """Weights that keep activations healthy: matrices N(0, 1/fan_in) so each projection keeps
    the input scale, zero-centred norm offsets N(0, 0.1)."""
    weights = {}
    for name, shape in weight_shapes(cfg).items():
        leaf = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
        if name == "embed_tokens.weight":
            tensor = torch.randn(shape, generator=generator)
        elif leaf == "A_log":
            tensor = torch.empty(shape).uniform_(1, 16, generator=generator).log()
        elif leaf == "dt_bias":
            # softplus(a + dt_bias) then spans about 0.01..1, so decays range from near 1
            # (long memory, which exercises the recurrence) to strong forgetting.
            tensor = torch.empty(shape).uniform_(-5, -1, generator=generator)
        elif leaf == "conv1d":
            tensor = torch.randn(shape, generator=generator) / math.sqrt(shape[-1])
        elif name.endswith("linear_attn.norm.weight"):  # the one plain-weight norm
            tensor = 1 + 0.1 * torch.randn(shape, generator=generator)
        elif len(shape) == 1:  # zero-centred (1 + w) norms
            tensor = 0.1 * torch.randn(shape, generator=generator)
        else:
            tensor = torch.randn(shape, generator=generator) / math.sqrt(shape[1])
        weights[name] = tensor
    return weights


def config_json(cfg, max_position_embeddings, eos_token_id):
    """The multimodal-wrapper config.json (model_type qwen3_5) that the real checkpoints use."""
    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": len(cfg.layer_types),
        "layer_types": list(cfg.layer_types),
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "attn_output_gate": cfg.attn_output_gate,
        "linear_num_key_heads": cfg.linear_key_heads,
        "linear_num_value_heads": cfg.linear_value_heads,
        "linear_key_head_dim": cfg.linear_key_dim,
        "linear_value_head_dim": cfg.linear_value_dim,
        "linear_conv_kernel_dim": cfg.conv_kernel,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
        },
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "eos_token_id": eos_token_id,
        "mamba_ssm_dtype": "float32",
        "dtype": "bfloat16",
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "text_config": text,
    }


def save_checkpoint(directory, config, weights, float32_names=(), shard_bytes=None):
    """Writes config.json and model.safetensors with HF names: BF16, except the short names in
    float32_names, which are stored as F32. With shard_bytes, tensors (in name order) go into
    model-0000i-of-0000n.safetensors files of at most that size (or one tensor) and
    model.safetensors.index.json maps each name to its file."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    def stored_name(name):
        return name if name == "lm_head.weight" else "model.language_model." + name

    stored = {stored_name(name): tensor for name, tensor in weights.items()}
    dtypes = {stored_name(name): "F32" if name in float32_names else "BF16" for name in weights}
    sizes = {name: tensor.numel() * (4 if dtypes[name] == "F32" else 2) for name, tensor in stored.items()}
    if shard_bytes is None or sum(sizes.values()) <= shard_bytes:
        write_safetensors(os.path.join(directory, "model.safetensors"), stored, dtypes)
        return
    shards = [[]]
    for name in sorted(stored):
        if shards[-1] and sum(sizes[n] for n in shards[-1]) + sizes[name] > shard_bytes:
            shards.append([])
        shards[-1].append(name)
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(directory, file), {n: stored[n] for n in names}, dtypes)
        weight_map.update({n: file for n in names})
    index = os.path.join(directory, "model.safetensors.index.json")
    with open(index + ".partial", "w") as f:  # last, and whole: it marks a complete export
        json.dump({"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    os.replace(index + ".partial", index)


def text_model_name(stored):
    """Maps a stored tensor name to the text model's short name (embed_tokens.weight,
    layers.N.…, norm.weight, lm_head.weight), or None for vision/MTP tensors."""
    if stored == "lm_head.weight":
        return stored
    for prefix in ("model.language_model.", "model."):
        if stored.startswith(prefix):
            short = stored[len(prefix):]
            if short.split(".")[0] in ("embed_tokens", "layers", "norm"):
                return short
            return None
    return None


def load_checkpoint(directory, dtype=torch.float64):
    """Returns (TextConfig, {short name: tensor}) from a single-file or sharded checkpoint."""
    with open(os.path.join(directory, "config.json")) as f:
        cfg = parse_config(json.load(f))
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for file in files:
        path = os.path.join(directory, file)
        header, _ = read_header(path)
        wanted = {name for name in header if text_model_name(name) is not None}
        for name, tensor in read_safetensors(path, wanted).items():
            weights[text_model_name(name)] = tensor.to(dtype)
    if cfg.tie_word_embeddings:
        weights.setdefault("lm_head.weight", weights["embed_tokens.weight"])
    return cfg, weights


def rms_norm(x, weight, eps):
    """Zero-centred RMSNorm: the stored weight is an offset from 1."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + weight)


def gated_rms_norm(x, gate, weight, eps):
    """GDN output norm: plain weight, then the SiLU output gate."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight * F.silu(gate)


def l2_normalize(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def rope_frequencies(rotary_dim, theta, yarn=None):
    """Inverse frequencies theta^(-2i/rotary_dim), one per rotated pair, and the factor on cos and
    sin. YaRN (transformers' "yarn" type): pair i turns r_i = L·f_i/(2π) times over the original
    context L; pairs turning more than beta_fast times keep f_i, fewer than beta_slow are divided by
    the factor, and between them the share divided grows linearly in i. The boundary pairs solve
    r_i = beta, i = rotary_dim·ln(L/(2π·beta))/(2·ln theta), floored/ceiled unless truncate is
    false, clipped to [0, rotary_dim-1]. Cos and sin are scaled by attention_factor, default
    0.1·mscale·ln(factor)+1 (1 when factor ≤ 1), as a ratio for mscale over mscale_all_dim."""
    pairs = torch.arange(rotary_dim // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * pairs / rotary_dim)
    if yarn is None:
        return inv_freq, 1.0

    def boundary(beta):
        return rotary_dim * math.log(yarn.original_max_position_embeddings / (2 * math.pi * beta)) / (2 * math.log(theta))

    low, high = boundary(yarn.beta_fast), boundary(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    divided = ((pairs - low) / (high - low)).clamp(0, 1)
    inv_freq = inv_freq / yarn.factor * divided + inv_freq * (1 - divided)

    def mscale(m):
        return 1.0 if yarn.factor <= 1 else 0.1 * m * math.log(yarn.factor) + 1

    scale = yarn.attention_factor
    if scale is None:
        scale = mscale(yarn.mscale) / mscale(yarn.mscale_all_dim) if yarn.mscale and yarn.mscale_all_dim else mscale(1)
    return inv_freq, scale


def apply_rope(x, positions, rotary_dim, theta, yarn=None):
    """NeoX rotate-half RoPE on the first rotary_dim dims of each head; x is [B, T, heads, D]."""
    half = rotary_dim // 2
    inv_freq, scale = rope_frequencies(rotary_dim, theta, yarn)
    angles = positions.to(torch.float64)[:, None] * inv_freq
    cos = (scale * angles.cos()).to(x.dtype)[None, :, None, :]
    sin = (scale * angles.sin()).to(x.dtype)[None, :, None, :]
    x1, x2, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)


def attend(q, k, v, mask):
    """Softmax attention of q [B,T,H,D] over k, v [B,S,Hkv,D] (GQA: query head h reads kv head
    h // (H/Hkv)); mask [T,S] is True where a key is visible."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.einsum("bhts,bshd->bthd", probs, v)


class Cache:
    """One request's (or one equal-length batch's) decoding state: per full-attention layer the
    keys (after k_norm and RoPE) and values; per GDN layer the last kernel-1 pre-conv inputs and
    the recurrent state [B, Hv, Dk, Dv]. A fresh Cache is a fresh request."""

    def __init__(self):
        self.length = 0
        self.layers = {}


def attention_inputs(cfg, w, prefix, x, positions):
    """The gated attention's projections of x [B, T, hidden] at positions [T]: queries and keys
    (after q_norm/k_norm and RoPE) [B, T, heads, D], values, and the output gate (None without
    attn_output_gate)."""
    batch, time, _ = x.shape
    heads, dim = cfg.num_heads, cfg.head_dim
    projected = x @ w[prefix + "q_proj.weight"].T
    if cfg.attn_output_gate:
        # Per head, the projection holds [query (dim) | gate (dim)].
        projected = projected.view(batch, time, heads, 2 * dim)
        q, gate = projected[..., :dim], projected[..., dim:].reshape(batch, time, heads * dim)
    else:
        q, gate = projected.view(batch, time, heads, dim), None
    q = rms_norm(q, w[prefix + "q_norm.weight"], cfg.rms_norm_eps)
    k = (x @ w[prefix + "k_proj.weight"].T).view(batch, time, cfg.num_kv_heads, dim)
    k = rms_norm(k, w[prefix + "k_norm.weight"], cfg.rms_norm_eps)
    v = (x @ w[prefix + "v_proj.weight"].T).view(batch, time, cfg.num_kv_heads, dim)
    q = apply_rope(q, positions, cfg.rotary_dim, cfg.rope_theta, cfg.yarn)
    k = apply_rope(k, positions, cfg.rotary_dim, cfg.rope_theta, cfg.yarn)
    return q, k, v, gate


def attention_output(w, prefix, attended, gate):
    """o_proj of the attended values [B, T, heads, D], gated when the layer has an output gate."""
    out = attended.reshape(attended.shape[0], attended.shape[1], -1)
    if gate is not None:
        out = out * torch.sigmoid(gate)
    return out @ w[prefix + "o_proj.weight"].T


def full_attention(cfg, w, prefix, x, state, start):
    time = x.shape[1]
    positions = torch.arange(start, start + time)
    q, k, v, gate = attention_inputs(cfg, w, prefix, x, positions)
    if "k" in state:
        k = torch.cat([state["k"], k], 1)
        v = torch.cat([state["v"], v], 1)
    state["k"], state["v"] = k, v
    causal = torch.arange(start + time)[None, :] <= positions[:, None]
    return attention_output(w, prefix, attend(q, k, v, causal), gate)


def delta_rule_recurrent(q, k, v, g, beta, state):
    """The gated delta rule one token at a time. q, k [B,T,H,Dk]; v [B,T,H,Dv]; g, beta
    [B,T,H]; state [B,H,Dk,Dv]. Returns (outputs [B,T,H,Dv], final state); each output reads
    the updated state."""
    outputs = []
    for t in range(k.shape[1]):
        state = state * g[:, t].exp()[..., None, None]
        predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        delta = beta[:, t, :, None] * (v[:, t] - predicted)
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, 1), state


def delta_rule_chunked(q, k, v, g, beta, state, chunk=64):
    """The same rule in chunked (WY) form, as HF torch_chunk_gated_delta_rule.

    Inside a chunk, with G_t the cumulative log decay since the chunk start and S0 the
    incoming state, the corrections Δ solve (I + A) Δ = βV − β e^G K S0, where A is strictly
    lower with A_ts = β_t (k_t·k_s) e^(G_t−G_s). So Δ = U − W S0 with U, W from one triangular
    solve; o_t = e^G_t q_t S0 + Σ_{s≤t} e^(G_t−G_s) (q_t·k_s) Δ_s.
    """
    batch, time, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    pad = -time % chunk  # padded steps have k = v = 0, g = 0, beta = 0: they change nothing
    q, k, v = [F.pad(x.transpose(1, 2), (0, 0, 0, pad)).reshape(batch, heads, -1, chunk, x.shape[-1]) for x in (q, k, v)]
    g, beta = [F.pad(x.transpose(1, 2), (0, pad)).reshape(batch, heads, -1, chunk) for x in (g, beta)]
    cumulative = g.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    strictly_lower = lower.tril(-1)
    # e^(G_t−G_s) for s ≤ t; masked before exp so the upper triangle cannot overflow.
    decay = (cumulative[..., :, None] - cumulative[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    a = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).masked_fill(~strictly_lower, 0)
    identity = torch.eye(chunk, dtype=q.dtype)
    rhs = torch.cat([beta[..., None] * v, (beta * cumulative.exp())[..., None] * k], -1)
    solved = torch.linalg.solve_triangular(a + identity, rhs, upper=False, unitriangular=True)
    u, w = solved.split([value_dim, key_dim], -1)
    qk_decayed = (q @ k.transpose(-1, -2)) * decay
    outputs = []
    for n in range(q.shape[2]):
        delta = u[:, :, n] - w[:, :, n] @ state
        g_n = cumulative[:, :, n]
        outputs.append(g_n.exp()[..., None] * (q[:, :, n] @ state) + qk_decayed[:, :, n] @ delta)
        to_end = (g_n[..., -1:] - g_n).exp()[..., None]
        state = g_n[..., -1, None, None].exp() * state + (k[:, :, n] * to_end).transpose(-1, -2) @ delta
    out = torch.stack(outputs, 2).reshape(batch, heads, -1, value_dim)[:, :, :time]
    return out.transpose(1, 2), state


def gated_deltanet(cfg, w, prefix, x, state, delta_rule):
    batch, time, _ = x.shape
    key_heads, value_heads = cfg.linear_key_heads, cfg.linear_value_heads
    key_dim, value_dim = cfg.linear_key_dim, cfg.linear_value_dim
    mixed = x @ w[prefix + "in_proj_qkv.weight"].T  # [q | k | v]
    conv_weight = w[prefix + "conv1d.weight"]  # [channels, 1, kernel]
    if "conv" not in state:  # a fresh request: zero conv and recurrent state
        state["conv"] = mixed.new_zeros(batch, conv_weight.shape[-1] - 1, mixed.shape[-1])
        state["recurrent"] = mixed.new_zeros(batch, value_heads, key_dim, value_dim)
    # Causal depthwise conv over [previous kernel-1 inputs ; new inputs].
    conv_input = torch.cat([state["conv"], mixed], 1)
    state["conv"] = conv_input[:, conv_input.shape[1] - state["conv"].shape[1]:]
    conv = F.conv1d(conv_input.transpose(1, 2), conv_weight, groups=mixed.shape[-1])
    q, k, v = F.silu(conv).transpose(1, 2).split([key_heads * key_dim, key_heads * key_dim, value_heads * value_dim], -1)
    q = l2_normalize(q.reshape(batch, time, key_heads, key_dim)) / math.sqrt(key_dim)
    k = l2_normalize(k.reshape(batch, time, key_heads, key_dim))
    v = v.reshape(batch, time, value_heads, value_dim)
    z = (x @ w[prefix + "in_proj_z.weight"].T).view(batch, time, value_heads, value_dim)
    beta = torch.sigmoid(x @ w[prefix + "in_proj_b.weight"].T)
    g = -w[prefix + "A_log"].exp() * F.softplus(x @ w[prefix + "in_proj_a.weight"].T + w[prefix + "dt_bias"])
    # Each q/k head serves value_heads/key_heads consecutive value heads.
    group = value_heads // key_heads
    q, k = q.repeat_interleave(group, 2), k.repeat_interleave(group, 2)
    out, state["recurrent"] = delta_rule(q, k, v, g, beta, state["recurrent"])
    out = gated_rms_norm(out, z, w[prefix + "norm.weight"], cfg.rms_norm_eps)
    return out.reshape(batch, time, value_heads * value_dim) @ w[prefix + "out_proj.weight"].T


def mlp(w, prefix, x):
    gate = x @ w[prefix + "gate_proj.weight"].T
    up = x @ w[prefix + "up_proj.weight"].T
    return (F.silu(gate) * up) @ w[prefix + "down_proj.weight"].T


def forward(cfg, w, ids, delta_rule=delta_rule_chunked, cache=None):
    """Runs ids [B, T] after whatever the cache holds (nothing when cache is None: a fresh
    request at position 0) and advances the cache. Returns (logits [B,T,V], list of each
    layer's output hidden state [B,T,hidden])."""
    cache = cache if cache is not None else Cache()
    start = cache.length
    x = w["embed_tokens.weight"][ids]
    hidden = []
    for index, kind in enumerate(cfg.layer_types):
        prefix = f"layers.{index}."
        state = cache.layers.setdefault(index, {})
        normed = rms_norm(x, w[prefix + "input_layernorm.weight"], cfg.rms_norm_eps)
        if kind == FULL:
            x = x + full_attention(cfg, w, prefix + "self_attn.", normed, state, start)
        else:
            x = x + gated_deltanet(cfg, w, prefix + "linear_attn.", normed, state, delta_rule)
        x = x + mlp(w, prefix + "mlp.", rms_norm(x, w[prefix + "post_attention_layernorm.weight"], cfg.rms_norm_eps))
        hidden.append(x)
    cache.length += ids.shape[1]
    logits = rms_norm(x, w["norm.weight"], cfg.rms_norm_eps) @ w["lm_head.weight"].T
    return logits, hidden


DELTA_RULES = {"chunked": delta_rule_chunked, "recurrent": delta_rule_recurrent}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="directory with config.json and safetensors")
    parser.add_argument("--ids", required=True, help="comma-separated token ids")
    parser.add_argument("--dump-hidden", action="store_true", help="also output each layer's hidden state")
    parser.add_argument("--delta-rule", choices=sorted(DELTA_RULES), default="recurrent")
    args = parser.parse_args()
    cfg, weights = load_checkpoint(args.checkpoint)
    ids = [int(t) for t in args.ids.split(",")]
    with torch.no_grad():
        logits, hidden = forward(cfg, weights, torch.tensor([ids]), DELTA_RULES[args.delta_rule])
    result = {"ids": ids, "logits": logits[0].tolist()}
    if args.dump_hidden:
        result["hidden"] = [h[0].tolist() for h in hidden]
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
