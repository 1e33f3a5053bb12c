#!/usr/bin/python3
"""Distils a DFlash drafter from the exported target (models/default/target/) and exports it,
in BF16 with z-lab tensor names, to models/default/draft/.

Training data are the target's own greedy continuations of training-text prompts and its
hidden states on them. One step takes several random anchors a per sequence; each block is
[token a, mask×15] at positions a…a+15, attends to the fused target features of positions
< a and (non-causally) to its own block, and learns the 15 target tokens after a. Earlier
block positions weigh more (exp(−(k−1)/γ)), since a draft is accepted only up to its first
miss. The target's embedding and lm_head are reused frozen.

Usage: train_draft.py [--steps N]
"""

import argparse
import time

import torch
import torch.nn.functional as F

import shared  # first: it puts tools/reference on the import path
import dflash
import qwen36
from train_target import MAX_POSITIONS

SEED = 2
PROMPT_TOKENS = 32
SEQUENCE_TOKENS = 128
SEQUENCES = 5120
TAPS = (1, 3, 5, 7)  # every other target layer, ending with the last one
BATCH = 16
ANCHORS_PER_SEQUENCE = 8
LEARNING_RATE = 3e-3
WARMUP_STEPS = 100
WEIGHT_DECAY = 0.01
POSITION_DECAY = 7.0  # γ in the weight exp(−(k−1)/γ) of block position k


def draft_config(mask_token_id):
    return dflash.DraftConfig(
        hidden_size=192,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=48,
        intermediate_size=512,
        rms_norm_eps=1e-6,
        rope_theta=10_000_000.0,
        block_size=16,
        mask_token_id=mask_token_id,
        target_layer_ids=TAPS,
    )


def training_data(target_cfg, target, train_ids):
    """(sequences [N, SEQUENCE_TOKENS], target features [N, SEQUENCE_TOKENS, taps·hidden] in BF16)."""
    prompts = shared.random_windows(train_ids, SEQUENCES, PROMPT_TOKENS, SEED)
    sequences, features = [], []
    with torch.no_grad():
        for batch in prompts.split(128):
            sequence = shared.greedy_continuations(target_cfg, target, batch, SEQUENCE_TOKENS - PROMPT_TOKENS)
            _, hidden = qwen36.forward(target_cfg, target, sequence)
            sequences.append(sequence)
            features.append(dflash.target_features(hidden, TAPS).to(torch.bfloat16))
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8000)
    args = parser.parse_args()
    shared.setup_torch(SEED)

    tokenizer = shared.load_tokenizer()
    train_ids, _, _ = shared.token_streams(tokenizer)
    target_cfg, target = qwen36.load_checkpoint(shared.TARGET_DIR, torch.float32)
    started = time.time()
    sequences, features = training_data(target_cfg, target, train_ids)
    generation_seconds = time.time() - started
    print(f"generated {len(sequences)} sequences in {generation_seconds:.0f}s", flush=True)

    cfg = draft_config(tokenizer.special_ids[shared.MASK])
    generator = torch.Generator().manual_seed(SEED)
    params = shared.trainable(dflash.init_draft_weights(cfg, generator), cfg.num_layers)
    optimizer = shared.adamw(params, LEARNING_RATE, WEIGHT_DECAY)
    embed, lm_head = target["embed_tokens.weight"], target["lm_head.weight"]
    position_weights = torch.exp(-torch.arange(cfg.block_size - 1) / POSITION_DECAY)
    anchor_range = torch.arange(PROMPT_TOKENS, SEQUENCE_TOKENS - cfg.block_size + 1)  # labels are all target tokens
    started = time.time()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = shared.cosine_learning_rate(step, args.steps, LEARNING_RATE, WARMUP_STEPS)
        rows = torch.randint(0, len(sequences), (BATCH,), generator=generator)
        anchors = anchor_range[torch.randperm(len(anchor_range), generator=generator)[:ANCHORS_PER_SEQUENCE]].sort().values
        loss, accepted = draft_loss(cfg, params, embed, lm_head, sequences[rows], features[rows], anchors, position_weights)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} accepted {accepted.item():.2f} {time.time() - started:.0f}s", flush=True)

    weights = {name: p.detach() for name, p in params.items()}
    dflash.save_draft(shared.DRAFT_DIR, dflash.draft_config_json(cfg, len(target_cfg.layer_types), target_cfg.vocab_size, MAX_POSITIONS), weights)
    metrics = {
        "steps": args.steps,
        "batch": BATCH,
        "anchors_per_sequence": ANCHORS_PER_SEQUENCE,
        "sequences": SEQUENCES,
        "generation_seconds": round(generation_seconds),
        "train_seconds": round(time.time() - started),
        "final_loss": round(loss.item(), 4),
        "parameters": sum(t.numel() for t in weights.values()),
    }
    shared.save_metrics("draft", metrics)


if __name__ == "__main__":
    main()
