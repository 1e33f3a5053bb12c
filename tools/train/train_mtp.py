#!/usr/bin/python3
"""Trains the multi-token-prediction head (mtp.*, docs/mtp.md) of the preset's exported target
(tiny: models/default/target/, demo: models/demo/target/) against the frozen target, and writes
it into the target checkpoint in the published layout: the mtp.* tensors in mtp.safetensors,
model.safetensors.index.json naming it beside the target's files, and mtp_num_hidden_layers 1
in config.json. With --out, a copy of the target gets the head instead.

Training data are the target's own greedy continuations of training-text prompts and its
final-normed last-layer hidden states on them. The continuations are the drafter's (the first of
train_draft.py's batches in <cache>/<preset>/draft-data/) where it kept them and this target
reproduces them, else generated: the same prompts either way. The head is unrolled as ddflash
drafts with it (tools/reference/mtp.py): step 1 pairs hidden state i with token i+1 at position
i and predicts token i+2; step k > 1 feeds step k-1's output and the true token i+k at position
i+k-1 and predicts token i+k+1, attending to step 1's keys up to position i and to its own
chain's. Later steps weigh less (exp(-(k-1)/γ)): a draft is accepted only up to its first miss.
The layer starts as a copy of the target's last attention layer; embedding and lm_head are the
target's, frozen.

Both stages resume: the continuations and hidden states are kept per batch of prompts in
<cache>/<preset>/mtp-data/, and training checkpoints to <cache>/<preset>/mtp.ckpt every few
minutes; --resume continues from them (without it both start afresh).

Usage: train_mtp.py [--preset tiny|demo] [--steps N] [--resume] [--out DIR]
"""

import json
import os
import shutil

import torch
import torch.nn.functional as F

import shared  # first: it puts tools/reference on the import path
import qwen36
from safetensors_io import read_header, write_safetensors

SEED = 3
MIN_AGREEMENT = 0.99  # below it, the drafter's continuations are not this target's
LAYER = "layers.0."
ATTN = LAYER + "self_attn."


def drafters_continuations(path, prompts):
    """The continuations of prompts the drafter kept at path, or None where it kept none."""
    if not os.path.exists(path):
        return None
    sequences = torch.load(path)["sequences"][:len(prompts)]
    return sequences if torch.equal(sequences[:, :shared.PROMPT_TOKENS], prompts) else None


def greedy_agreement(logits, sequences):
    """The fraction of the continuation tokens that are the argmax of the preceding
    position's logits: 1 for the target's own greedy continuations but for near-ties, which
    the incremental and the whole-sequence forward may break apart."""
    predicted = logits[:, shared.PROMPT_TOKENS - 1:-1].argmax(-1)
    return (predicted == sequences[:, shared.PROMPT_TOKENS:]).float().mean().item()


def training_data(preset, cfg, target, train_ids, data_dir):
    """(sequences [N, SEQUENCE_TOKENS], final-normed last-layer hidden states [N,
    SEQUENCE_TOKENS, hidden] in BF16) for the drafter's first preset.mtp.sequences prompts,
    each batch computed once and kept in data_dir."""
    assert preset.mtp.sequences <= preset.draft.sequences, "the MTP head learns from the drafter's prompts"
    batches = shared.continuation_prompts(preset, train_ids)[:preset.mtp.sequences].split(shared.GENERATION_BATCH)
    drafters_dir = os.path.join(preset.cache_dir, "draft-data")
    os.makedirs(data_dir, exist_ok=True)
    sequences, hidden = [], []
    for i, batch in enumerate(batches):
        path = shared.data_batch_path(data_dir, i)
        if not os.path.exists(path):
            with torch.no_grad():
                sequence = drafters_continuations(shared.data_batch_path(drafters_dir, i), batch)
                if sequence is not None:
                    logits, layers = qwen36.forward(cfg, target, sequence)
                    agreement = greedy_agreement(logits, sequence)
                    print(f"batch {i + 1} of {len(batches)}: the drafter's, {agreement:.2%} this target's greedy tokens", flush=True)
                    if agreement < MIN_AGREEMENT:  # an earlier target's
                        sequence = None
                if sequence is None:
                    sequence = shared.greedy_continuations(cfg, target, batch, shared.SEQUENCE_TOKENS - shared.PROMPT_TOKENS)
                    _, layers = qwen36.forward(cfg, target, sequence)
                    print(f"generated batch {i + 1} of {len(batches)}", flush=True)
                normed = qwen36.rms_norm(layers[-1], target["norm.weight"], cfg.rms_norm_eps)
            shared.save_atomically({"sequences": sequence, "hidden": normed.to(torch.bfloat16)}, path)
        data = torch.load(path)
        sequences.append(data["sequences"])
        hidden.append(data["hidden"])
    return torch.cat(sequences), torch.cat(hidden)


def initial_head(cfg, target, generator):
    """fc small and random, the norms at 1 (their zero-centred weights 0), the decoder layer a
    copy of the target's last full-attention layer."""
    h = cfg.hidden_size
    last = max(i for i, kind in enumerate(cfg.layer_types) if kind == qwen36.FULL)
    head = {name.replace(f"layers.{last}.", LAYER): t.clone() for name, t in target.items() if name.startswith(f"layers.{last}.")}
    head["fc.weight"] = torch.randn(h, 2 * h, generator=generator) / (2 * h) ** 0.5
    for norm in ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"):
        head[norm] = torch.zeros(h)
    return head


def unrolled_logits(cfg, head, embed, lm_head, sequences, hidden, steps):
    """The logits of the head's steps 1..steps at every position i whose labels exist, each
    [B, rows, vocab], and their labels (token i+k+1 for step k)."""
    eps, time_ = cfg.rms_norm_eps, sequences.shape[1]
    rows = time_ - steps - 1  # positions i whose labels i+k+1 all exist
    index = torch.arange(rows)
    keys, values, out = [], [], []
    g = hidden[:, :rows]
    for k in range(1, steps + 1):
        tokens, labels = sequences[:, k:k + rows], sequences[:, k + 1:k + 1 + rows]
        x = torch.cat([
            qwen36.rms_norm(embed[tokens], head["pre_fc_norm_embedding.weight"], eps),
            qwen36.rms_norm(g, head["pre_fc_norm_hidden.weight"], eps),
        ], -1) @ head["fc.weight"].T
        normed = qwen36.rms_norm(x, head[LAYER + "input_layernorm.weight"], eps)
        q, key, value, gate = qwen36.attention_inputs(cfg, head, ATTN, normed, index + k - 1)
        keys.append(key)
        values.append(value)
        # Step 1's keys up to position i (the committed context), then each earlier step's
        # key of the same row (the draft's own chain) and this step's.
        visible = [index[None, :] <= index[:, None]] + [torch.eye(rows, dtype=torch.bool)] * (k - 1)
        attended = qwen36.attend(q, torch.cat(keys, 1), torch.cat(values, 1), torch.cat(visible, 1))
        x = x + qwen36.attention_output(head, ATTN, attended, gate)
        x = x + qwen36.mlp(head, LAYER + "mlp.", qwen36.rms_norm(x, head[LAYER + "post_attention_layernorm.weight"], eps))
        g = qwen36.rms_norm(x, head["norm.weight"], eps)
        out.append((g @ lm_head.T, labels))
    return out


def unrolled_loss(cfg, head, embed, lm_head, sequences, hidden, steps, step_weights):
    """Weighted cross-entropy of the head's steps on every position, and the mean number of
    leading steps whose greedy token is right."""
    per_step = unrolled_logits(cfg, head, embed, lm_head, sequences, hidden, steps)
    losses = torch.stack([F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)) for logits, labels in per_step])
    loss = (losses * step_weights).sum() / step_weights.sum()
    hits = torch.stack([logits.argmax(-1) == labels for logits, labels in per_step], -1)
    accepted = hits.int().cumprod(-1).sum(-1).float().mean()
    return loss, accepted


def export(directory, head):
    """Writes the head into the checkpoint in directory: mtp.safetensors (BF16), the index naming
    it beside the target's files, and mtp_num_hidden_layers 1 in config.json."""
    stored = {"mtp." + name: t.detach() for name, t in head.items()}
    write_safetensors(os.path.join(directory, "mtp.safetensors"), stored, {name: "BF16" for name in stored})
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    else:  # a single-file target: index its tensors where they are
        header, _ = read_header(os.path.join(directory, "model.safetensors"))
        index = {"metadata": {}, "weight_map": {name: "model.safetensors" for name in header}}
    weight_map = {name: file for name, file in index["weight_map"].items() if not name.startswith("mtp.")}
    weight_map.update({name: "mtp.safetensors" for name in stored})
    index["weight_map"] = dict(sorted(weight_map.items()))
    config_path = os.path.join(directory, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.get("text_config", config)["mtp_num_hidden_layers"] = 1
    for path, value in ((config_path, config), (index_path, index)):  # the index last: it names the head
        with open(path + ".partial", "w") as f:
            json.dump(value, f, indent=2)
            f.write("\n")
        os.replace(path + ".partial", path)


def add_out_argument(parser):
    parser.add_argument("--out", help="write a copy of the target with the head here (default: into the target itself)")


def main():
    stage = shared.start_stage("mtp", __doc__, SEED, training_data, add_out_argument)
    args, preset, settings = stage.args, stage.preset, stage.settings
    cfg, target = stage.target_cfg, stage.target
    sequences, hidden = stage.data

    generator = torch.Generator().manual_seed(SEED)
    params = {name: torch.nn.Parameter(t) for name, t in initial_head(cfg, target, generator).items()}
    optimizer = shared.adamw(params, settings.learning_rate, settings.weight_decay)
    embed, lm_head = target["embed_tokens.weight"], target["lm_head.weight"]
    step_weights = torch.exp(-torch.arange(settings.unroll) / settings.step_decay)

    def batch_loss():
        rows = torch.randint(0, len(sequences), (settings.batch,), generator=generator)
        return unrolled_loss(cfg, params, embed, lm_head, sequences[rows], hidden[rows].to(torch.float32), settings.unroll, step_weights)

    train_seconds, last_loss = stage.train(params, optimizer, generator, batch_loss, f" of {settings.unroll}")

    out = args.out or preset.target_dir
    if args.out:
        shutil.copytree(preset.target_dir, out, dirs_exist_ok=True)
    export(out, params)
    metrics = {
        "preset": preset.name,
        "steps": stage.steps,
        "batch": settings.batch,
        "unroll": settings.unroll,
        "sequences": settings.sequences,
        "generation_seconds": round(stage.generation_seconds),
        "train_seconds": round(train_seconds),
        "final_loss": round(last_loss, 4),
        "parameters": sum(t.numel() for t in params.values()),
        "output": out,
    }
    shared.save_metrics(preset.cache_dir, "mtp", metrics)


if __name__ == "__main__":
    main()
