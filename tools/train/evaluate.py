#!/usr/bin/python3
"""Measures the preset's exported pair (tiny: models/default/, demo: models/demo/) on held-out
prompts: linear DFlash acceptance length τ at temperature 0 (the docs/dflash-ddtree.md §2
loop) and the share of distinct 4-grams in the target's greedy outputs. Writes the prompts,
their greedy continuations and per-prompt τ to eval.json beside the pair, so the Go engine
can compare against them, and the prompt texts to heldout.jsonl, a `ddflash bench --raw`
workload (one single-turn conversation each).

At temperature 0 the committed tokens are exactly the target's greedy continuation, so the
loop is simulated on that continuation: each round drafts from the features of every
position before the anchor, accepts the leading drafts that match, and moves on by a+1.

Usage: evaluate.py [--preset tiny|demo]
"""

import argparse
import json
import os

import torch

import shared  # first: it puts tools/reference on the import path
import dflash
import presets
import qwen36
import train_draft

SEED = 3
PROMPTS = 24
PROMPT_TOKENS = 32
NEW_TOKENS = 96
EARLY_TOKENS = 32  # τ is also reported over the first 32 new tokens


def acceptance_lengths(draft_cfg, draft, target, sequence, features):
    """Per-round τ_r = a+1 for the greedy continuation sequence[PROMPT_TOKENS:], each capped
    so the rounds add up to NEW_TOKENS − 1 (the first new token comes from the prefill)."""
    embed, lm_head = target["embed_tokens.weight"], target["lm_head.weight"]
    start, end, lengths = PROMPT_TOKENS, len(sequence) - 1, []
    while start < end:
        drafts = dflash.draft_block(draft_cfg, draft, embed, lm_head, features[None, :start], sequence[start:start + 1])[0].argmax(-1)
        truth = sequence[start + 1:start + draft_cfg.block_size]
        matches = (drafts[:len(truth)] == truth).int().cumprod(0).sum().item()
        produced = min(matches + 1, end - start)
        lengths.append(produced)
        start += produced
    return lengths


def rounds_covering(lengths, tokens):
    """(tokens produced, rounds) for the rounds that produce the first `tokens` new tokens
    after the prefill token."""
    done, rounds = 0, 0
    for length in lengths:
        if done >= tokens - 1:
            break
        done += length
        rounds += 1
    return done, rounds


def distinct_four_gram_share(tokens):
    grams = [tuple(tokens[i:i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / len(grams)


def check_training_matches_inference(draft_cfg, draft, target, sequence, features):
    """The multi-block masked training forward must give the inference draft for each anchor."""
    embed, lm_head = target["embed_tokens.weight"], target["lm_head.weight"]
    anchors = torch.tensor([PROMPT_TOKENS, PROMPT_TOKENS + 7, len(sequence) - draft_cfg.block_size])
    ids, positions, visible, _ = train_draft.block_batch(draft_cfg, sequence[None], anchors)
    context = dflash.fuse_context(draft_cfg, draft, features[None])
    hidden = dflash.draft_hidden(draft_cfg, draft, context, torch.arange(len(sequence)), embed[ids], positions, visible)
    for i, anchor in enumerate(anchors.tolist()):
        trained = hidden[0, i * draft_cfg.block_size + 1:(i + 1) * draft_cfg.block_size] @ lm_head.T
        inferred = dflash.draft_block(draft_cfg, draft, embed, lm_head, features[None, :anchor], sequence[anchor:anchor + 1])[0]
        assert (trained - inferred).abs().max() < 1e-3, f"training and inference drafts differ at anchor {anchor}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    presets.add_argument(parser)
    preset = presets.PRESETS[parser.parse_args().preset]
    shared.setup_torch(SEED, preset.cache_dir)
    tokenizer = shared.load_tokenizer(preset.target_dir)
    _, held_out_ids, _ = shared.token_streams(tokenizer)
    target_cfg, target = qwen36.load_checkpoint(preset.target_dir, torch.float32)
    draft_cfg, draft = dflash.load_draft(preset.draft_dir, torch.float32)

    prompts = shared.random_windows(held_out_ids, PROMPTS, PROMPT_TOKENS, SEED)
    sequences = shared.greedy_continuations(target_cfg, target, prompts, NEW_TOKENS)
    with torch.no_grad():
        _, hidden = qwen36.forward(target_cfg, target, sequences)
        features = dflash.target_features(hidden, draft_cfg.target_layer_ids)
        check_training_matches_inference(draft_cfg, draft, target, sequences[0], features[0])
        records, covered = [], {NEW_TOKENS: [], EARLY_TOKENS: []}
        for sequence, feature in zip(sequences, features):
            lengths = acceptance_lengths(draft_cfg, draft, target, sequence, feature)
            for horizon, counts in covered.items():
                counts.append(rounds_covering(lengths, horizon))
            generated = sequence[PROMPT_TOKENS:].tolist()
            records.append({
                "prompt_ids": sequence[:PROMPT_TOKENS].tolist(),
                "prompt_text": tokenizer.decode(sequence[:PROMPT_TOKENS].tolist()),
                "greedy_ids": generated,
                "greedy_text": tokenizer.decode(generated),
                "acceptance_lengths": lengths,
                "tau": round(covered[NEW_TOKENS][-1][0] / covered[NEW_TOKENS][-1][1], 3),
                "tau_first_32": round(covered[EARLY_TOKENS][-1][0] / covered[EARLY_TOKENS][-1][1], 3),
                "distinct_4gram_share": round(distinct_four_gram_share(generated), 3),
            })

    # "mean" averages the per-prompt τ; "pooled" divides all tokens by all rounds.
    summary = {f"mean_{key}": round(sum(r[key] for r in records) / len(records), 3) for key in ("tau", "tau_first_32", "distinct_4gram_share")}
    for horizon, name in ((NEW_TOKENS, "pooled_tau"), (EARLY_TOKENS, "pooled_tau_first_32")):
        summary[name] = round(sum(d for d, _ in covered[horizon]) / sum(r for _, r in covered[horizon]), 3)
    result = {
        "description": "held-out prompts, the target's greedy continuations (temperature 0) and the linear DFlash "
                       "acceptance lengths of the Python reference (tools/train/evaluate.py)",
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS,
        "summary": summary,
        "prompts": records,
    }
    model_dir = os.path.dirname(preset.target_dir)
    with open(os.path.join(model_dir, "eval.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(os.path.join(model_dir, "heldout.jsonl"), "w") as f:
        f.writelines(json.dumps({"turns": [r["prompt_text"]]}) + "\n" for r in records)
    print(json.dumps(summary))
    print("sample:", repr(records[0]["prompt_text"]), "->", repr(records[0]["greedy_text"]))


if __name__ == "__main__":
    main()
