"""Reference forward of the multi-token-prediction (MTP) head that Qwen3.5/3.6/3.8 checkpoints
ship under mtp.* (docs/mtp.md), written from the published implementations: vLLM
vllm/model_executor/models/qwen3_5_mtp.py @ 01d99805 (Qwen3_5MultiTokenPredictor.forward) and
vllm/v1/spec_decode/llm_base_proposer.py @ 00c4f22d (propose: shifted ids, unshifted positions,
later steps fed the head's own output), SGLang python/sglang/srt/models/qwen3_5_mtp.py @ 008b79d2.

One step over rows (token t_{i+1}, target hidden h_i) at positions p_i:
    x = fc(cat[pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(h_i)])
    x = decoder layer (gated full attention + MLP, the target's layer kind) at positions p_i
    g = norm(x);  logits = lm_head(g)
h is the target's hidden state as its LM head sees it (after the final norm). All norms are the
zero-centred (1 + w) RMSNorm. Step k > 1 feeds step k-1's g of the last row and its greedy token
at the next position, attending to the same layer cache.
"""

import os

import torch

import qwen36
from safetensors_io import read_header, read_safetensors

PREFIX = "mtp."


def load_mtp(directory, dtype=torch.float64):
    """Returns {name without the mtp. prefix: tensor} from a single-file or sharded checkpoint."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    weights = {}
    for file in files:
        path = os.path.join(directory, file)
        header, _ = read_header(path)
        wanted = {name for name in header if name.startswith(PREFIX)}
        for name, tensor in read_safetensors(path, wanted).items():
            weights[name[len(PREFIX):]] = tensor.to(dtype)
    if not weights:
        raise ValueError(f"{directory}: no {PREFIX}* tensors")
    return weights


def step(cfg, target, head, state, ids, hidden, start):
    """One application of the head to rows ids [1, T] and hidden [1, T, hidden] at positions
    start..start+T-1, appending their keys and values to state. Returns (g, logits)."""
    eps = cfg.rms_norm_eps
    embedded = qwen36.rms_norm(target["embed_tokens.weight"][ids], head["pre_fc_norm_embedding.weight"], eps)
    normed_hidden = qwen36.rms_norm(hidden, head["pre_fc_norm_hidden.weight"], eps)
    x = torch.cat([embedded, normed_hidden], -1) @ head["fc.weight"].T
    p = "layers.0."
    normed = qwen36.rms_norm(x, head[p + "input_layernorm.weight"], eps)
    x = x + qwen36.full_attention(cfg, head, p + "self_attn.", normed, state, start)
    x = x + qwen36.mlp(head, p + "mlp.", qwen36.rms_norm(x, head[p + "post_attention_layernorm.weight"], eps))
    g = qwen36.rms_norm(x, head["norm.weight"], eps)
    return g, g @ target["lm_head.weight"].T


def draft(cfg, target, head, ids, anchor, steps, valid_vocab):
    """The head's draft after the committed tokens ids (a fresh request) with the anchor (the
    token after them, not yet fed to the target): steps rows of logits [steps, vocab] and the
    greedy tokens (argmax over the first valid_vocab ids) each step fed the next."""
    _, layers = qwen36.forward(cfg, target, torch.tensor([ids]))
    hidden = qwen36.rms_norm(layers[-1], target["norm.weight"], cfg.rms_norm_eps)
    next_ids = torch.tensor([list(ids[1:]) + [anchor]])
    state, start, rows, tokens = {}, 0, [], []
    for _ in range(steps):
        g, logits = step(cfg, target, head, state, next_ids, hidden, start)
        start += next_ids.shape[1]
        last = logits[0, -1]
        rows.append(last)
        token = int(last[:valid_vocab].argmax())
        tokens.append(token)
        next_ids, hidden = torch.tensor([[token]]), g[:, -1:]
    return torch.stack(rows), tokens
