#!/usr/bin/python3
"""Writes the golden of the qwen36-shapes preset (Qwen3.6-27B's exact per-layer shapes and
248,320-token vocabulary, one GDN and one attention layer): float64 reference logits of one token
sequence, from the checkpoint that `ddflash testmodel` regenerates from a seed. The checkpoint
(6.6 GB) is not committed; its SHA-256 is, so the test knows it regenerated the same weights.

Whole-vocabulary rows are too big to commit, so for every position the golden keeps the logits of
fixed sampled columns, the log-sum-exp over all 248,320 logits and the argmax.

The weights are read one tensor at a time (the embedding only at the sequence's rows, the LM head
in row blocks), so memory stays near one float64 MLP matrix (0.7 GB) plus the bf16 page cache.

Usage (from the repository root, Debian's python3):
  go run ./cmd/ddflash testmodel --preset qwen36-shapes --dtype bf16 --seed 1 --out /tmp/qwen36-shapes
  tools/reference/make_shapes_golden.py /tmp/qwen36-shapes engine/realshape/testdata/qwen36-shapes.json
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen36  # noqa: E402
from safetensors_io import _bf16_bits_to_float32, file_sha256, read_header, read_safetensors, write_golden  # noqa: E402

IDS = [5, 80, 33, 140, 7, 250, 18, 99]
LM_HEAD_BLOCK = 16384  # rows of the LM head widened to float64 at a time
SAMPLED_EVERY = 997  # every 997th vocabulary id, plus the first 256 (the byte tokens' region)


class Checkpoint:
    """Reads model.safetensors tensors by short name, as float64, on demand."""

    def __init__(self, path):
        self.path = path
        self.header, self.data_start = read_header(path)

    def stored_name(self, short):
        return short if short == "lm_head.weight" else qwen36_prefix + short

    def __getitem__(self, short):
        name = self.stored_name(short)
        return read_safetensors(self.path, {name})[name].double()

    def rows(self, short, start, stop):
        """Rows [start, stop) of a BF16 matrix, as float64."""
        info = self.header[self.stored_name(short)]
        assert info["dtype"] == "BF16", info
        width = info["shape"][1]
        with open(self.path, "rb") as f:
            f.seek(self.data_start + info["data_offsets"][0] + 2 * start * width)
            raw = f.read(2 * (stop - start) * width)
        values = _bf16_bits_to_float32(np.frombuffer(raw, dtype="<u2")).reshape(stop - start, width)
        return torch.from_numpy(values.copy()).double()


qwen36_prefix = "model.language_model."


class Weights(dict):
    """The forward's weight lookup: the checkpoint's tensors loaded when asked for, except the
    embedding (only the sequence's rows, looked up by position in IDS) and the LM head (a dummy:
    the logits are computed in blocks below)."""

    def __init__(self, checkpoint, cfg):
        super().__init__()
        self.checkpoint = checkpoint
        self["embed_tokens.weight"] = torch.cat([checkpoint.rows("embed_tokens.weight", i, i + 1) for i in IDS])
        self["lm_head.weight"] = torch.zeros(1, cfg.hidden_size, dtype=torch.float64)

    def __missing__(self, short):
        return self.checkpoint[short]


def main():
    checkpoint_dir, out = sys.argv[1], sys.argv[2]
    path = os.path.join(checkpoint_dir, "model.safetensors")
    with open(os.path.join(checkpoint_dir, "config.json")) as f:
        cfg = qwen36.parse_config(json.load(f))
    checkpoint = Checkpoint(path)
    weights = Weights(checkpoint, cfg)
    with torch.no_grad():
        # Embedding rows are in IDS order, so the forward looks them up by position.
        _, hidden = qwen36.forward(cfg, weights, torch.arange(len(IDS))[None], qwen36.delta_rule_recurrent)
        final = qwen36.rms_norm(hidden[-1][0], checkpoint["norm.weight"], cfg.rms_norm_eps)
        logits = torch.cat([final @ checkpoint.rows("lm_head.weight", start, min(start + LM_HEAD_BLOCK, cfg.vocab_size)).T
                            for start in range(0, cfg.vocab_size, LM_HEAD_BLOCK)], 1)
    columns = sorted(set(range(256)) | set(range(0, cfg.vocab_size, SAMPLED_EVERY)) | {cfg.vocab_size - 1})
    golden = {
        "generator": "tools/reference/make_shapes_golden.py (float64 reference tools/reference/qwen36.py)",
        "checkpoint": "ddflash testmodel --preset qwen36-shapes --dtype bf16 --seed 1",
        "model_safetensors_sha256": file_sha256(path),
        "ids": IDS,
        "columns": columns,
        "layout": "logits[position][i] is the logit of vocabulary id columns[i]; logsumexp and argmax are over the "
                  "whole vocabulary; a fresh request starting at position 0",
        "logits": [[round(v, 9) for v in row[columns].tolist()] for row in logits],
        "logsumexp": logits.logsumexp(-1).tolist(),
        "argmax": logits.argmax(-1).tolist(),
        "max": logits.max(-1).values.tolist(),
    }
    write_golden(out, golden)
    print(f"wrote {out}: {len(IDS)} positions, {len(columns)} sampled columns, argmax {golden['argmax']}")


if __name__ == "__main__":
    main()
