#!/usr/bin/python3
"""Distils a DFlash drafter from the preset's exported target (tiny: models/default/target/,
demo: models/demo/target/) and exports it, in BF16 with z-lab tensor names, beside it.

Training data are the target's own greedy continuations of training-text prompts and its
hidden states on them. One step takes several random anchors a per sequence; each block is
[token a, mask×15] at positions a…a+15, attends to the fused target features of positions
< a and (non-causally) to its own block, and learns the 15 target tokens after a. Earlier
block positions weigh more (exp(−(k−1)/γ)), since a draft is accepted only up to its first
miss. The target's embedding and lm_head are reused frozen.

Both stages resume: the continuations are kept per batch of prompts in
<cache>/<preset>/draft-data/, and training checkpoints to <cache>/<preset>/draft.ckpt every
few minutes; --resume continues from them (without it both start afresh).

Usage: train_draft.py [--preset tiny|demo] [--steps N] [--resume]
"""

import os

import torch
import torch.nn.functional as F

import shared  # first: it puts tools/reference on the import path
import dflash
import qwen36

SEED = 2


def draft_config(preset, mask_token_id):
    d = preset.draft
    return dflash.DraftConfig(
        hidden_size=preset.target.hidden_size,
        num_layers=d.num_layers,
        num_heads=d.num_heads,
        num_kv_heads=d.num_kv_heads,
        head_dim=d.head_dim,
        intermediate_size=d.intermediate_size,
        rms_norm_eps=1e-6,
        rope_theta=10_000_000.0,
        block_size=16,
        mask_token_id=mask_token_id,
        target_layer_ids=d.taps,
    )


def training_data(preset, target_cfg, target, train_ids, data_dir):
    """(sequences [N, SEQUENCE_TOKENS], target features [N, SEQUENCE_TOKENS, taps·hidden] in
    BF16), each batch of prompts generated once and kept in data_dir."""
    batches = shared.continuation_prompts(preset, train_ids).split(shared.GENERATION_BATCH)
    os.makedirs(data_dir, exist_ok=True)
    sequences, features = [], []
    for i, batch in enumerate(batches):
        path = shared.data_batch_path(data_dir, i)
        if not os.path.exists(path):
            with torch.no_grad():
                sequence = shared.greedy_continuations(target_cfg, target, batch, shared.SEQUENCE_TOKENS - shared.PROMPT_TOKENS)
                _, hidden = qwen36.forward(target_cfg, target, sequence)
            feature = dflash.target_features(hidden, preset.draft.taps).to(torch.bfloat16)
            shared.save_atomically({"sequences": sequence, "features": feature}, path)
            print(f"generated batch {i + 1} of {len(batches)}", flush=True)
        data = torch.load(path)
        sequences.append(data["sequences"])
        features.append(data["features"])
    return torch.cat(sequences), torch.cat(features)


def block_batch(cfg, sequences, anchors):
    """Block inputs, positions, visibility mask and labels for anchors (shared by the batch)."""
    block = cfg.block_size
    ids = torch.full((len(sequences), len(anchors) * block), cfg.mask_token_id)
    ids[:, ::block] = sequences[:, anchors]
    positions = (anchors[:, None] + torch.arange(block)).reshape(-1)
    owner = torch.arange(len(anchors)).repeat_interleave(block)  # which block each row is in
    sees_context = torch.arange(sequences.shape[1])[None, :] < anchors[owner][:, None]
    sees_block = owner[:, None] == owner[None, :]
    labels = sequences[:, (anchors[:, None] + torch.arange(1, block)).reshape(-1)]
    return ids, positions, torch.cat([sees_context, sees_block], 1), labels


def draft_loss(cfg, params, embed, lm_head, sequences, features, anchors, position_weights):
    """Weighted cross-entropy over block positions 1…15, and how many leading drafts match."""
    ids, positions, visible, labels = block_batch(cfg, sequences, anchors)
    context = dflash.fuse_context(cfg, params, features.to(torch.float32))
    hidden = dflash.draft_hidden(cfg, params, context, torch.arange(sequences.shape[1]), embed[ids], positions, visible)
    rows = hidden.view(len(sequences), len(anchors), cfg.block_size, -1)[:, :, 1:]
    logits = rows @ lm_head.T
    labels = labels.view(len(sequences), len(anchors), cfg.block_size - 1)
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(labels.shape)
    loss = (losses * position_weights).sum(-1).mean() / position_weights.sum()
    accepted = (logits.argmax(-1) == labels).int().cumprod(-1).sum(-1).float().mean()
    return loss, accepted


def main():
    stage = shared.start_stage("draft", __doc__, SEED, training_data)
    preset, settings = stage.preset, stage.settings
    target_cfg, target = stage.target_cfg, stage.target
    sequences, features = stage.data

    cfg = draft_config(preset, stage.tokenizer.special_ids[shared.MASK])
    generator = torch.Generator().manual_seed(SEED)
    params = shared.trainable(dflash.init_draft_weights(cfg, generator), cfg.num_layers)
    optimizer = shared.adamw(params, settings.learning_rate, settings.weight_decay)
    embed, lm_head = target["embed_tokens.weight"], target["lm_head.weight"]
    position_weights = torch.exp(-torch.arange(cfg.block_size - 1) / settings.position_decay)
    anchor_range = torch.arange(shared.PROMPT_TOKENS, shared.SEQUENCE_TOKENS - cfg.block_size + 1)  # labels are all target tokens

    def batch_loss():
        rows = torch.randint(0, len(sequences), (settings.batch,), generator=generator)
        anchors = anchor_range[torch.randperm(len(anchor_range), generator=generator)[:settings.anchors_per_sequence]].sort().values
        return draft_loss(cfg, params, embed, lm_head, sequences[rows], features[rows], anchors, position_weights)

    train_seconds, last_loss = stage.train(params, optimizer, generator, batch_loss)

    weights = {name: p.detach() for name, p in params.items()}
    config = dflash.draft_config_json(cfg, len(target_cfg.layer_types), target_cfg.vocab_size, preset.max_positions)
    dflash.save_draft(preset.draft_dir, config, weights)
    metrics = {
        "preset": preset.name,
        "steps": stage.steps,
        "batch": settings.batch,
        "anchors_per_sequence": settings.anchors_per_sequence,
        "sequences": settings.sequences,
        "generation_seconds": round(stage.generation_seconds),
        "train_seconds": round(train_seconds),
        "final_loss": round(last_loss, 4),
        "parameters": sum(t.numel() for t in weights.values()),
    }
    shared.save_metrics(preset.cache_dir, "draft", metrics)


if __name__ == "__main__":
    main()
