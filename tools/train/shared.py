"""The tokenizer's special tokens, the corpus token streams, resumable checkpoints, the
drafters' common set-up and the training helpers shared by the training and evaluation scripts."""

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))

ENDOFTEXT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, MASK]  # they take the last ids of the vocabulary
VOCAB_SIZE = 512

import bpe  # noqa: E402
import corpus  # noqa: E402
import qwen36  # noqa: E402


def setup_torch(seed, cache_dir):
    # One thread by default: on cores shared with other jobs, two OpenBLAS threads spin-wait
    # on each other and a training step took 5-10x longer than with one.
    torch.set_num_threads(int(os.environ.get("DDFLASH_TORCH_THREADS", "1")))
    # Strong GDN decays underflow into denormals, which make CPU float math several times slower.
    torch.set_flush_denormal(True)
    torch.manual_seed(seed)
    os.makedirs(cache_dir, exist_ok=True)


def load_tokenizer(directory):
    with open(os.path.join(directory, "tokenizer.json")) as f:
        merges = json.load(f)["model"]["merges"]
    return bpe.Tokenizer(merges, SPECIAL_TOKENS)


def token_streams(tokenizer):
    """(train ids, held-out ids, held-out UTF-8 bytes per token): each split's documents
    concatenated into one stream."""
    train, held_out = corpus.split_documents()
    train_ids = torch.tensor(tokenizer.encode("".join(train)))
    held_out_ids = torch.tensor(tokenizer.encode("".join(held_out)))
    bytes_per_token = sum(len(d.encode()) for d in held_out) / len(held_out_ids)
    return train_ids, held_out_ids, bytes_per_token


def bits_per_byte(nats_per_token, bytes_per_token):
    return nats_per_token / math.log(2) / bytes_per_token


def greedy_continuations(cfg, weights, prompts, new_tokens):
    """prompts [B, P] -> [B, P + new_tokens]: the target's greedy continuations, decoded
    incrementally (chunked prefill, then one token at a time through the cache)."""
    with torch.no_grad():
        cache = qwen36.Cache()
        logits, _ = qwen36.forward(cfg, weights, prompts, qwen36.delta_rule_chunked, cache)
        tokens = [logits[:, -1].argmax(-1)]
        for _ in range(new_tokens - 1):
            logits, _ = qwen36.forward(cfg, weights, tokens[-1][:, None], qwen36.delta_rule_recurrent, cache)
            tokens.append(logits[:, -1].argmax(-1))
    return torch.cat([prompts, torch.stack(tokens, 1)], 1)


def random_windows(ids, count, length, seed):
    """count windows of length tokens at seeded random offsets in the stream ids."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - length, (count,), generator=generator)
    return ids[starts[:, None] + torch.arange(length)]


# The drafters learn from the target's greedy continuations of training-text prompts of
# PROMPT_TOKENS tokens to SEQUENCE_TOKENS, generated and kept in batches of GENERATION_BATCH
# prompts (train_draft.py's draft-data/, which train_mtp.py reuses).
PROMPT_TOKENS = 32
SEQUENCE_TOKENS = 128
GENERATION_BATCH = 128
CONTINUATION_SEED = 2


def continuation_prompts(preset, train_ids):
    """The drafter's preset.draft.sequences prompts [N, PROMPT_TOKENS]; split by
    GENERATION_BATCH, batch i is the one kept in data_batch_path(..., i)."""
    return random_windows(train_ids, preset.draft.sequences, PROMPT_TOKENS, CONTINUATION_SEED)


def data_batch_path(data_dir, index):
    return os.path.join(data_dir, f"batch-{index:04d}.pt")


def save_atomically(value, path):
    torch.save(value, path + ".partial")
    os.replace(path + ".partial", path)


# Projections that write into the residual stream.
RESIDUAL_OUTPUTS = ("o_proj.weight", "out_proj.weight", "down_proj.weight")


def trainable(weights, num_layers):
    """Parameters from a reference init, with the residual-stream outputs scaled by
    1/sqrt(2·layers) so the stream does not grow with depth."""
    scale = 1 / math.sqrt(2 * num_layers)
    return {name: torch.nn.Parameter(t * scale if name.endswith(RESIDUAL_OUTPUTS) else t) for name, t in weights.items()}


def adamw(params, learning_rate, weight_decay):
    """AdamW that decays matrices only (not norms, A_log, dt_bias)."""
    decayed = [p for p in params.values() if p.dim() >= 2]
    others = [p for p in params.values() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decayed, "weight_decay": weight_decay}, {"params": others, "weight_decay": 0.0}],
        lr=learning_rate, betas=(0.9, 0.95),
    )


def cosine_learning_rate(step, steps, peak, warmup):
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def bf16_matmuls(enabled):
    """Autocasts the projections to BF16 when enabled (the element-wise work stays float32
    where its inputs are, as the residual stream)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def float32_delta_rule(q, k, v, g, beta, state):
    """The chunked delta rule in float32 whatever autocast made of its inputs: its decays
    and triangular solve need the precision."""
    with torch.autocast("cpu", enabled=False):
        return qwen36.delta_rule_chunked(q.float(), k.float(), v.float(), g.float(), beta.float(), state.float())


@dataclass
class Stage:
    """A drafter training stage, set up by start_stage."""
    args: argparse.Namespace
    preset: object  # presets.Preset
    settings: object  # the preset's settings for the stage (preset.draft, preset.mtp)
    steps: int
    checkpoint: "Checkpoint"
    tokenizer: bpe.Tokenizer
    target_cfg: qwen36.TextConfig
    target: dict
    data: tuple  # what training_data returned, sequences first
    generation_seconds: float

    def train(self, params, optimizer, generator, batch_loss, accepted_of=""):
        """Runs the stage's steps from its checkpoint (else from step 0) on the cosine schedule,
        gradients clipped to norm 1: batch_loss() draws a batch with generator and returns (loss,
        mean leading drafts right). Logs every 50 steps, checkpoints when due; returns (seconds
        spent by all runs, last loss)."""
        settings, steps = self.settings, self.steps
        first_step, earlier_seconds, last_loss = self.checkpoint.restore(params, optimizer, generator)
        started = time.time()
        for step in range(first_step, steps):
            for group in optimizer.param_groups:
                group["lr"] = cosine_learning_rate(step, steps, settings.learning_rate, settings.warmup_steps)
            loss, accepted = batch_loss()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            optimizer.step()
            last_loss = loss.item()
            seconds = earlier_seconds + time.time() - started
            if step % 50 == 0 or step == steps - 1:
                print(f"step {step} loss {last_loss:.3f} accepted {accepted.item():.2f}{accepted_of} {seconds:.0f}s", flush=True)
            if self.checkpoint.due() or step == steps - 1:
                self.checkpoint.save(params, optimizer, generator, step + 1, seconds, last_loss)
        return earlier_seconds + time.time() - started, last_loss


def start_stage(name, description, seed, training_data, add_arguments=lambda parser: None):
    """Sets up the training stage name ("draft", "mtp") of a drafter of the preset's target:
    parses --preset, --steps, --resume and what add_arguments adds; seeds torch; on a fresh run
    (no --resume) removes the stage's <cache>/<preset>/<name>-data/ and <name>.ckpt; loads the
    tokenizer, the training text and the target; and times training_data(preset, target_cfg,
    target, train_ids, data_dir)."""
    import presets  # not at the top: presets imports this module

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    presets.add_argument(parser)
    parser.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    parser.add_argument("--resume", action="store_true", help="reuse generated data and continue from the checkpoint, if any")
    add_arguments(parser)
    args = parser.parse_args()
    preset = presets.PRESETS[args.preset]
    settings = getattr(preset, name)
    setup_torch(seed, preset.cache_dir)
    data_dir = os.path.join(preset.cache_dir, f"{name}-data")
    checkpoint = Checkpoint(os.path.join(preset.cache_dir, f"{name}.ckpt"))
    if not args.resume:  # a fresh run: neither stage may pick up an earlier run's files later
        shutil.rmtree(data_dir, ignore_errors=True)
        checkpoint.remove()

    tokenizer = load_tokenizer(preset.target_dir)
    train_ids, _, _ = token_streams(tokenizer)
    target_cfg, target = qwen36.load_checkpoint(preset.target_dir, torch.float32)
    started = time.time()
    data = training_data(preset, target_cfg, target, train_ids, data_dir)
    generation_seconds = time.time() - started
    print(f"{len(data[0])} training sequences ready in {generation_seconds:.0f}s", flush=True)
    return Stage(args, preset, settings, args.steps or settings.steps, checkpoint, tokenizer, target_cfg, target, data,
                 generation_seconds)


class Checkpoint:
    """A training run's resumable state (parameters, optimizer, sampling RNG, step, seconds
    spent, last loss) in one file, rewritten atomically when due (every `every_seconds`), so a
    stopped run loses only minutes and resumes with the batches it would have drawn."""

    def __init__(self, path, every_seconds=300):
        self.path, self.every_seconds = path, every_seconds
        self.saved = time.time()

    def restore(self, params, optimizer, generator):
        """Loads the saved state into params, optimizer and generator; returns (next step,
        seconds spent, last loss), or (0, 0.0, None) when there is no checkpoint."""
        if not os.path.exists(self.path):
            return 0, 0.0, None
        state = torch.load(self.path)
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(state["params"][name])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        print(f"resumed from {self.path} at step {state['step']}", flush=True)
        return state["step"], state["seconds"], state["loss"]

    def due(self):
        return time.time() - self.saved >= self.every_seconds

    def save(self, params, optimizer, generator, step, seconds, loss):
        """Saves the state before step `step`."""
        state = {
            "params": {name: p.detach() for name, p in params.items()},
            "optimizer": optimizer.state_dict(),
            "generator": generator.get_state(),
            "step": step,
            "seconds": seconds,
            "loss": loss,
        }
        save_atomically(state, self.path)
        self.saved = time.time()

    def remove(self):
        if os.path.exists(self.path):
            os.remove(self.path)


def save_metrics(cache_dir, name, metrics):
    """Writes a training run's metrics to cache_dir/<name>_metrics.json and prints them."""
    with open(os.path.join(cache_dir, f"{name}_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(json.dumps(metrics), flush=True)
