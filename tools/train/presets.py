"""The trained pairs: architecture and training settings of each target and its drafter.

tiny  models/default/: the 3.5M-parameter pair the tests and the embedded default use.
demo  models/demo/: a 64M-parameter target (128 MB in BF16, several times a CPU's last-level
      cache, so a decode step is memory-bound and verifying several rows costs little more
      than one) in Qwen3.6's layer pattern and head geometry, for `make run`'s demonstration.
"""

import os
from dataclasses import dataclass

import shared  # first: it puts tools/reference on the import path
import qwen36

REPO = shared.REPO


@dataclass(frozen=True)
class DraftSettings:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    taps: tuple  # target layers whose outputs the drafter reads
    sequences: int  # greedy continuations it learns from
    batch: int
    anchors_per_sequence: int
    steps: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    position_decay: float  # γ in the weight exp(−(k−1)/γ) of block position k


@dataclass(frozen=True)
class MTPSettings:
    sequences: int  # greedy continuations it learns from
    batch: int
    unroll: int  # steps of the head trained together (as --mtp-steps drafts)
    steps: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    step_decay: float  # γ in the weight exp(−(k−1)/γ) of step k


@dataclass(frozen=True)
class Preset:
    name: str
    model_dir: str  # relative to the repository
    target: qwen36.TextConfig
    context: int  # training window
    max_positions: int
    batch: int
    steps: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    log_every: int  # steps between training-loss lines
    eval_every: int  # steps between held-out losses
    bf16_matmuls: bool  # autocast the projections to BF16 (oneDNN's run 4x Debian's float32 ones; a step 1.25x)
    train_tokenizer: bool  # False: reuse models/default's tokenizer
    draft: DraftSettings
    mtp: MTPSettings

    @property
    def target_dir(self):
        return os.path.join(REPO, self.model_dir, "target")

    @property
    def draft_dir(self):
        return os.path.join(REPO, self.model_dir, "draft")

    @property
    def cache_dir(self):
        """Intermediate files (checkpoints, greedy continuations, metrics), outside the tree."""
        return os.path.join(os.environ.get("DDFLASH_TRAIN_CACHE", "/var/tmp/ddflash-train"), self.name)


def _pattern(repeats):
    """Qwen3.6's layer pattern: three Gated DeltaNet layers, then one gated attention layer."""
    return ((qwen36.LINEAR,) * 3 + (qwen36.FULL,)) * repeats


PRESETS = {
    "tiny": Preset(
        name="tiny",
        model_dir="models/default",
        target=qwen36.TextConfig(
            hidden_size=192, layer_types=_pattern(2), intermediate_size=512, vocab_size=shared.VOCAB_SIZE,
            num_heads=4, num_kv_heads=2, head_dim=48, attn_output_gate=True,
            linear_key_heads=2, linear_value_heads=4, linear_key_dim=32, linear_value_dim=32, conv_kernel=4,
            rope_theta=10_000_000.0, partial_rotary_factor=0.25, rms_norm_eps=1e-6, tie_word_embeddings=False,
        ),
        context=256, max_positions=512, batch=8, steps=1200, learning_rate=3e-3, warmup_steps=100,
        weight_decay=0.1, log_every=50, eval_every=500, bf16_matmuls=False, train_tokenizer=True,
        draft=DraftSettings(
            num_layers=2, num_heads=4, num_kv_heads=2, head_dim=48, intermediate_size=512, taps=(1, 3, 5, 7),
            sequences=5120, batch=16, anchors_per_sequence=8, steps=8000, learning_rate=3e-3, warmup_steps=100,
            weight_decay=0.01, position_decay=7.0,
        ),
        mtp=MTPSettings(sequences=2560, batch=16, unroll=3, steps=3000, learning_rate=1e-3, warmup_steps=100,
                        weight_decay=0.01, step_decay=2.0),
    ),
    # Qwen3.6-27B's head geometry (attention heads of 256 with a quarter rotary, GDN heads of 128
    # with three value heads per key head) in one repeat of its pattern: on a CPU a wide, shallow
    # model trains about 1.7x faster per token than 8 narrower layers of the same size, since the
    # per-layer element-wise work and the delta rule scale with depth, not width.
    "demo": Preset(
        name="demo",
        model_dir="models/demo",
        target=qwen36.TextConfig(
            hidden_size=1024, layer_types=_pattern(1), intermediate_size=4096, vocab_size=shared.VOCAB_SIZE,
            num_heads=4, num_kv_heads=1, head_dim=256, attn_output_gate=True,
            linear_key_heads=2, linear_value_heads=6, linear_key_dim=128, linear_value_dim=128, conv_kernel=4,
            rope_theta=10_000_000.0, partial_rotary_factor=0.25, rms_norm_eps=1e-6, tie_word_embeddings=False,
        ),
        context=256, max_positions=512, batch=16, steps=400, learning_rate=1e-3, warmup_steps=20,
        weight_decay=0.1, log_every=1, eval_every=100, bf16_matmuls=True, train_tokenizer=False,
        # One layer: drafting is paid every round, so its cost is weighed against τ.
        draft=DraftSettings(
            num_layers=1, num_heads=4, num_kv_heads=1, head_dim=256, intermediate_size=2048, taps=(1, 3),
            sequences=2560, batch=16, anchors_per_sequence=8, steps=2000, learning_rate=1e-3, warmup_steps=50,
            weight_decay=0.01, position_decay=7.0,
        ),
        # 400 steps (about 15 minutes here) so the whole pair trains within one working session.
        mtp=MTPSettings(sequences=1280, batch=16, unroll=3, steps=400, learning_rate=5e-4, warmup_steps=50,
                        weight_decay=0.01, step_decay=2.0),
    ),
}


def add_argument(parser):
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="which pair (default tiny: models/default)")
