"""Reference forward of a DFlash2 drafter (docs/dflash2.md), written from the published
formulas: vLLM PR #52816, llama.cpp PR #27342 and SGLang PR #35371 describe

  grouped dynamic depthwise convolution, block-local (taps are zero across the block boundary):
      out[i,c] = sum_t (base[t,c] + delta[i,t,g(c)]) * x[i-t,c],  g(c) = c // conv_group_size
  around each sublayer: delta for both sides is one projection (kernel_projection) of the
  sublayer's normed input, split [2, taps, groups]; side 0 convolves that input before the
  sublayer with base_kernel[0], side 1 the sublayer's output with base_kernel[1];

  candidate selector over the top selector_top_k tokens of each proposal row's unary logits
  (lm_head logits * output_multiplier, soft-capped by final_logit_softcapping when set):
      edge(p -> c) = unary[c] + < A[p] * (P h), B[c] >
  A, B = predecessor / successor codebooks [vocab, rank], P = hidden_projection [rank, hidden],
  h = the row's final-normed hidden state; the first row's predecessor is the anchor token; the
  greedy walk takes the highest edge after the previous pick.

Everything else is the DFlash drafter of tools/reference/dflash.py.
"""

import math

import torch

import dflash
from qwen36 import apply_rope, attend, mlp

V2_ARCHITECTURE = "DFlash2DraftModel"


def v2_fields(raw):
    """The DFlash2 settings: dflash_config first, then the top level (absent optional ones at
    their defaults)."""
    nested = raw.get("dflash_config", {})

    def get(name, default=None):
        return nested.get(name, raw.get(name, default))

    return {
        "conv_kernel_size": get("conv_kernel_size"),
        "conv_group_size": get("conv_group_size"),
        "selector_rank": get("selector_rank"),
        "selector_top_k": get("selector_top_k"),
        "output_multiplier": get("output_multiplier", 1.0),
        "final_logit_softcapping": get("final_logit_softcapping"),
        "input_embedding_scale": get("input_embedding_scale", 1.0),
    }


def v2_weight_shapes(cfg, v2, vocab_size):
    hidden, taps, rank = cfg.hidden_size, v2["conv_kernel_size"], v2["selector_rank"]
    groups = hidden // v2["conv_group_size"]
    shapes = {
        "candidate_selector.hidden_projection.weight": (rank, hidden),
        "candidate_selector.predecessor_codebook": (vocab_size, rank),
        "candidate_selector.successor_codebook": (vocab_size, rank),
    }
    for i in range(cfg.num_layers):
        for conv in ("attention_conv", "mlp_conv"):
            p = f"layers.{i}.{conv}."
            shapes[p + "base_kernel"] = (2, taps, hidden)
            shapes[p + "kernel_projection.weight"] = (2 * taps * groups, hidden)
    return shapes


def init_v2_weights(cfg, v2, vocab_size, generator):
    """Random DFlash2 additions: static taps near the identity (tap 0 near 1, later taps small),
    dynamic-tap projections and selector matrices N(0, 1/fan_in) scaled so that neither the
    convolution nor the pair scores swamp the rest."""
    weights = {}
    for name, shape in v2_weight_shapes(cfg, v2, vocab_size).items():
        if name.endswith("base_kernel"):
            w = 0.3 * torch.randn(shape, generator=generator)
            w[:, 0] += 1
        elif name.endswith("codebook"):
            w = torch.randn(shape, generator=generator)
        else:
            w = 0.5 * torch.randn(shape, generator=generator) / math.sqrt(shape[1])
        weights[name] = w
    return weights


def grouped_conv(x, delta, base, group_size):
    """x [B, N, hidden] (one block), delta [B, N, taps, groups], base [taps, hidden]."""
    batch, rows, hidden = x.shape
    taps = base.shape[0]
    out = torch.zeros_like(x)
    for t in range(taps):
        shifted = torch.zeros_like(x)
        if t < rows:
            shifted[:, t:] = x[:, : rows - t]
        weight = base[t].view(1, 1, hidden) + delta[:, :, t].repeat_interleave(group_size, dim=-1)
        out += weight * shifted
    return out


def conv_prepare(w, prefix, v2, u):
    """Side 0 applied to the sublayer input u, and the side-1 dynamic taps for conv_finish."""
    taps, group_size = v2["conv_kernel_size"], v2["conv_group_size"]
    groups = u.shape[-1] // group_size
    delta = (u @ w[prefix + "kernel_projection.weight"].T).view(*u.shape[:2], 2, taps, groups)
    return grouped_conv(u, delta[:, :, 0], w[prefix + "base_kernel"][0], group_size), delta[:, :, 1]


def conv_finish(w, prefix, v2, y, delta):
    return grouped_conv(y, delta, w[prefix + "base_kernel"][1], v2["conv_group_size"])


def draft_hidden(cfg, v2, w, context, context_positions, block, block_positions, visible):
    """dflash.draft_hidden with the convolutions: returns the final-normed hidden states."""
    batch, rows, _ = block.shape
    heads, kv_heads, dim, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    key_positions = torch.cat([context_positions, block_positions])
    x = block
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        u = dflash.rms_norm(x, w[p + "input_layernorm.weight"], eps)
        u, attn_delta = conv_prepare(w, p + "attention_conv.", v2, u)
        keys_from = torch.cat([context, u], 1)  # context rows skip the norm and the convolution
        q = dflash.rms_norm((u @ w[p + "self_attn.q_proj.weight"].T).view(batch, rows, heads, dim), w[p + "self_attn.q_norm.weight"], eps)
        k = dflash.rms_norm((keys_from @ w[p + "self_attn.k_proj.weight"].T).view(batch, -1, kv_heads, dim), w[p + "self_attn.k_norm.weight"], eps)
        v = (keys_from @ w[p + "self_attn.v_proj.weight"].T).view(batch, -1, kv_heads, dim)
        q = apply_rope(q, block_positions, dim, cfg.rope_theta)
        k = apply_rope(k, key_positions, dim, cfg.rope_theta)
        attn = attend(q, k, v, visible[i]).reshape(batch, rows, heads * dim) @ w[p + "self_attn.o_proj.weight"].T
        x = x + conv_finish(w, p + "attention_conv.", v2, attn, attn_delta)
        u, mlp_delta = conv_prepare(w, p + "mlp_conv.", v2, dflash.rms_norm(x, w[p + "post_attention_layernorm.weight"], eps))
        x = x + conv_finish(w, p + "mlp_conv.", v2, mlp(w, p + "mlp.", u), mlp_delta)
    return dflash.rms_norm(x, w["norm.weight"], eps)


def unary_logits(v2, logits):
    logits = logits * v2["output_multiplier"]
    cap = v2["final_logit_softcapping"]
    if cap:
        logits = cap * torch.tanh(logits / cap)
    return logits


def select(v2, w, hidden, logits, anchor_id, valid_vocab):
    """The selector for one block: hidden [N, hidden] (final-normed proposal rows), logits [N, V]
    (unary). Returns per row the candidates (top selector_top_k of the first valid_vocab ids,
    descending, ties by lower id), the edge scores [N][predecessors][K] and the greedy path."""
    k = v2["selector_top_k"]
    projected = hidden @ w["candidate_selector.hidden_projection.weight"].T
    A, B = w["candidate_selector.predecessor_codebook"], w["candidate_selector.successor_codebook"]
    candidates, scores = [], []
    predecessors = torch.tensor([anchor_id])
    for row in range(hidden.shape[0]):
        values = logits[row, :valid_vocab]
        order = sorted(range(valid_vocab), key=lambda i: (-values[i].item(), i))[:k]
        ids = torch.tensor(order)
        edges = values[ids][None, :] + (A[predecessors] * projected[row]) @ B[ids].T
        candidates.append(order)
        scores.append(edges)
        predecessors = ids
    path, previous = [], 0
    for row, edges in enumerate(scores):
        previous = int(torch.argmax(edges[previous]))  # first maximum: the lower candidate index
        path.append(candidates[row][previous])
    return candidates, scores, path


def draft_block(cfg, v2, w, embed, lm_head, features, anchor_id, valid_vocab):
    """One inference draft step of a single sequence (dflash.draft_block's block and masks).
    Returns the unary logits [block_size-1, V] and the selector's candidates, scores and path."""
    _, start, _ = features.shape
    ids = torch.full((1, cfg.block_size), cfg.mask_token_id)
    ids[0, 0] = anchor_id
    block_positions = torch.arange(start, start + cfg.block_size)
    key_positions = torch.arange(start + cfg.block_size)
    visible = [dflash.layer_visible(cfg, i, block_positions, key_positions) for i in range(cfg.num_layers)]
    block = embed[ids] * v2["input_embedding_scale"]
    hidden = draft_hidden(cfg, v2, w, dflash.fuse_context(cfg, w, features), torch.arange(start), block, block_positions, visible)
    proposals = hidden[0, 1:]
    logits = unary_logits(v2, proposals @ lm_head.T)
    return (logits,) + select(v2, w, proposals, logits, anchor_id, valid_vocab)
