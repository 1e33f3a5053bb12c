#!/usr/bin/python3
"""Trains the tiny Qwen3.5-architecture target on the KJV corpus (CPU, float32, chunked GDN)
and exports it with its byte-level BPE tokenizer, in BF16, to models/default/target/.

Usage: train_target.py [--steps N]
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F

import shared  # first: it puts tools/reference on the import path
import bpe
import qwen36

SEED = 1
CONFIG = qwen36.TextConfig(
    hidden_size=192,
    layer_types=((qwen36.LINEAR,) * 3 + (qwen36.FULL,)) * 2,
    intermediate_size=512,
    vocab_size=shared.VOCAB_SIZE,
    num_heads=4,
    num_kv_heads=2,
    head_dim=48,
    attn_output_gate=True,
    linear_key_heads=2,
    linear_value_heads=4,
    linear_key_dim=32,
    linear_value_dim=32,
    conv_kernel=4,
    rope_theta=10_000_000.0,
    partial_rotary_factor=0.25,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
CONTEXT = 256  # training window; max_position_embeddings allows twice that
MAX_POSITIONS = 512
BATCH = 8
LEARNING_RATE = 3e-3
WARMUP_STEPS = 100
WEIGHT_DECAY = 0.1


def language_model_loss(cfg, weights, windows):
    """Mean next-token cross-entropy (nats) over windows [B, T+1]."""
    logits, _ = qwen36.forward(cfg, weights, windows[:, :-1])
    return F.cross_entropy(logits.reshape(-1, cfg.vocab_size), windows[:, 1:].reshape(-1))


def held_out_loss(cfg, weights, ids):
    """Mean loss over the held-out stream cut into non-overlapping CONTEXT-token windows."""
    count = (len(ids) - 1) // CONTEXT
    windows = torch.stack([ids[i * CONTEXT:(i + 1) * CONTEXT + 1] for i in range(count)])
    with torch.no_grad():
        losses = [language_model_loss(cfg, weights, batch) for batch in windows.split(32)]
    sizes = [len(batch) for batch in windows.split(32)]
    return sum(loss.item() * n for loss, n in zip(losses, sizes)) / count


def train(cfg, train_ids, held_out_ids, bytes_per_token, steps):
    generator = torch.Generator().manual_seed(SEED)
    weights = shared.trainable(qwen36.init_weights(cfg, generator), len(cfg.layer_types))
    optimizer = shared.adamw(weights, LEARNING_RATE, WEIGHT_DECAY)
    started = time.time()
    for step in range(steps):
        learning_rate = shared.cosine_learning_rate(step, steps, LEARNING_RATE, WARMUP_STEPS)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
        starts = torch.randint(0, len(train_ids) - CONTEXT - 1, (BATCH,), generator=generator)
        windows = train_ids[starts[:, None] + torch.arange(CONTEXT + 1)]
        loss = language_model_loss(cfg, weights, windows)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(weights.values()), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.3f} lr {learning_rate:.2e} {time.time() - started:.0f}s", flush=True)
        if (step + 1) % 500 == 0:
            held = held_out_loss(cfg, weights, held_out_ids)
            print(f"held-out loss {held:.3f} = {shared.bits_per_byte(held, bytes_per_token):.3f} bits/byte", flush=True)
    return {name: p.detach() for name, p in weights.items()}, time.time() - started, loss.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1200)
    args = parser.parse_args()
    shared.setup_torch(SEED)

    train_documents, _ = shared.corpus.split_documents()
    merges = shared.VOCAB_SIZE - 256 - len(shared.SPECIAL_TOKENS)
    tokenizer = bpe.Tokenizer.train(train_documents, merges, shared.SPECIAL_TOKENS)
    os.makedirs(shared.TARGET_DIR, exist_ok=True)
    tokenizer.save(shared.TARGET_DIR, MAX_POSITIONS)
    train_ids, held_out_ids, bytes_per_token = shared.token_streams(tokenizer)
    print(f"corpus: {len(train_ids)} train tokens, {len(held_out_ids)} held-out tokens, {bytes_per_token:.2f} bytes/token", flush=True)

    weights, seconds, final_loss = train(CONFIG, train_ids, held_out_ids, bytes_per_token, args.steps)
    eos = [tokenizer.special_ids[shared.IM_END], tokenizer.special_ids[shared.ENDOFTEXT]]
    qwen36.save_checkpoint(shared.TARGET_DIR, qwen36.config_json(CONFIG, MAX_POSITIONS, eos), weights)

    # Score what was exported: the BF16 weights, read back.
    _, exported = qwen36.load_checkpoint(shared.TARGET_DIR, torch.float32)
    held = held_out_loss(CONFIG, exported, held_out_ids)
    metrics = {
        "steps": args.steps,
        "batch": BATCH,
        "context": CONTEXT,
        "train_seconds": round(seconds),
        "final_train_loss": round(final_loss, 4),
        "held_out_loss_bf16": round(held, 4),
        "held_out_bits_per_byte_bf16": round(shared.bits_per_byte(held, bytes_per_token), 4),
        "parameters": sum(t.numel() for t in weights.values()),
    }
    shared.save_metrics("target", metrics)


if __name__ == "__main__":
    main()
