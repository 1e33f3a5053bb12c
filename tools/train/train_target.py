#!/usr/bin/python3
"""Trains a Qwen3.5-architecture target on the KJV corpus (CPU, chunked GDN) and exports it
with its byte-level BPE tokenizer, in BF16, to the preset's target directory (tiny:
models/default/target/, demo: models/demo/target/, in shards of at most 45 MB).

The run checkpoints itself (parameters, optimizer, sampling RNG, step) to
<cache>/<preset>/target.ckpt every few minutes; --resume continues from there with the same
batches and schedule the uninterrupted run would have had.

Usage: train_target.py [--preset tiny|demo] [--steps N] [--resume]
"""

import argparse
import os
import shutil
import time

import torch
import torch.nn.functional as F

import shared  # first: it puts tools/reference on the import path
import bpe
import presets
import qwen36

SEED = 1
SHARD_BYTES = 45_000_000  # keeps each exported file well under the 50 MB a git host warns at


def language_model_loss(cfg, weights, windows):
    """Mean next-token cross-entropy (nats) over windows [B, T+1]."""
    logits, _ = qwen36.forward(cfg, weights, windows[:, :-1], shared.float32_delta_rule)
    return F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), windows[:, 1:].reshape(-1))


def held_out_loss(cfg, weights, ids, context):
    """Mean loss over the held-out stream cut into non-overlapping context-token windows."""
    count = (len(ids) - 1) // context
    windows = torch.stack([ids[i * context:(i + 1) * context + 1] for i in range(count)])
    with torch.no_grad():
        losses = [language_model_loss(cfg, weights, batch) for batch in windows.split(32)]
    sizes = [len(batch) for batch in windows.split(32)]
    return sum(loss.item() * n for loss, n in zip(losses, sizes)) / count


def train(preset, train_ids, held_out_ids, bytes_per_token, steps, checkpoint):
    cfg = preset.target
    generator = torch.Generator().manual_seed(SEED)
    weights = shared.trainable(qwen36.init_weights(cfg, generator), len(cfg.layer_types))
    optimizer = shared.adamw(weights, preset.learning_rate, preset.weight_decay)
    first_step, earlier_seconds, last_loss = checkpoint.restore(weights, optimizer, generator)
    started = time.time()
    for step in range(first_step, steps):
        learning_rate = shared.cosine_learning_rate(step, steps, preset.learning_rate, preset.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
        starts = torch.randint(0, len(train_ids) - preset.context - 1, (preset.batch,), generator=generator)
        windows = train_ids[starts[:, None] + torch.arange(preset.context + 1)]
        with shared.bf16_matmuls(preset.bf16_matmuls):
            loss = language_model_loss(cfg, weights, windows)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(weights.values()), 1.0)
        optimizer.step()
        last_loss = loss.item()
        seconds = earlier_seconds + time.time() - started
        if step % preset.log_every == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.3f} lr {learning_rate:.2e} {seconds:.0f}s", flush=True)
        if (step + 1) % preset.eval_every == 0:
            held = held_out_loss(cfg, weights, held_out_ids, preset.context)
            print(f"held-out loss {held:.3f} = {shared.bits_per_byte(held, bytes_per_token):.3f} bits/byte", flush=True)
        if checkpoint.due() or step == steps - 1:
            checkpoint.save(weights, optimizer, generator, step + 1, seconds, last_loss)
    seconds = earlier_seconds + time.time() - started
    return {name: p.detach() for name, p in weights.items()}, seconds, last_loss


def tokenizer_for(preset):
    """Trains the BPE tokenizer on the training split, or reuses models/default's."""
    if preset.train_tokenizer:
        train_documents, _ = shared.corpus.split_documents()
        merges = shared.VOCAB_SIZE - 256 - len(shared.SPECIAL_TOKENS)
        return bpe.Tokenizer.train(train_documents, merges, shared.SPECIAL_TOKENS)
    return shared.load_tokenizer(presets.PRESETS["tiny"].target_dir)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    presets.add_argument(parser)
    parser.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    parser.add_argument("--resume", action="store_true", help="continue from the preset's checkpoint, if any")
    args = parser.parse_args()
    preset = presets.PRESETS[args.preset]
    steps = args.steps or preset.steps
    shared.setup_torch(SEED, preset.cache_dir)

    tokenizer = tokenizer_for(preset)
    train_ids, held_out_ids, bytes_per_token = shared.token_streams(tokenizer)
    print(f"corpus: {len(train_ids)} train tokens, {len(held_out_ids)} held-out tokens, {bytes_per_token:.2f} bytes/token", flush=True)

    checkpoint = shared.Checkpoint(os.path.join(preset.cache_dir, "target.ckpt"))
    if not args.resume:
        checkpoint.remove()  # a fresh run: nothing may resume from an earlier run's state
    weights, seconds, final_loss = train(preset, train_ids, held_out_ids, bytes_per_token, steps, checkpoint)

    shutil.rmtree(preset.target_dir, ignore_errors=True)  # no shards of an earlier export may stay
    os.makedirs(preset.target_dir)
    tokenizer.save(preset.target_dir, preset.max_positions)
    eos = [tokenizer.special_ids[shared.IM_END], tokenizer.special_ids[shared.ENDOFTEXT]]
    config = qwen36.config_json(preset.target, preset.max_positions, eos)
    qwen36.save_checkpoint(preset.target_dir, config, weights, shard_bytes=SHARD_BYTES)

    # Score what was exported: the BF16 weights, read back.
    _, exported = qwen36.load_checkpoint(preset.target_dir, torch.float32)
    held = held_out_loss(preset.target, exported, held_out_ids, preset.context)
    metrics = {
        "preset": preset.name,
        "steps": steps,
        "batch": preset.batch,
        "context": preset.context,
        "train_seconds": round(seconds),
        "final_train_loss": round(final_loss, 4),
        "held_out_loss_bf16": round(held, 4),
        "held_out_bits_per_byte_bf16": round(shared.bits_per_byte(held, bytes_per_token), 4),
        "parameters": sum(t.numel() for t in weights.values()),
    }
    shared.save_metrics(preset.cache_dir, "target", metrics)


if __name__ == "__main__":
    main()
