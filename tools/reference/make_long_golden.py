#!/usr/bin/python3
"""Writes the long-context golden: the long-h256 test preset (one GDN and one attention layer with
Qwen3.6-27B's head dims: attention 1×256 with rotary 64, GDN 1 key / 3 value heads × 128) after a
32,768-token prompt. Float64 reference logits at sampled prompt positions, then at each of a few
continuation tokens (the reference's own greedy choices), fed after the whole prompt.

The reference runs the prompt in 1,024-token chunks through its cache (full attention over all
earlier keys, the chunked delta rule from the carried state), which check_incremental_matches_full
in make_golden.py shows equal to one whole forward.

Usage (from the repository root, Debian's python3):
  go run ./cmd/ddflash testmodel --preset long-h256 --dtype bf16 --seed 1 --out /tmp/long-h256
  tools/reference/make_long_golden.py /tmp/long-h256 engine/testdata/long-h256.json
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen36  # noqa: E402
from safetensors_io import file_sha256, write_golden  # noqa: E402

SEED = 32768
PROMPT = 32768
CHUNK = 1024
CONTINUATION = 6
MAX_ID = 300  # below the tokenizer's id count: real tokens, no padding rows
SAMPLED = (0, 1, 63, 64, 1023, 1024, 4097, 16383, 16384, 32766, 32767)


def main():
    checkpoint_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    cfg, weights = qwen36.load_checkpoint(checkpoint_dir)
    generator = torch.Generator().manual_seed(SEED)
    prompt = torch.randint(0, MAX_ID, (PROMPT,), generator=generator).tolist()
    cache = qwen36.Cache()
    sampled = {}
    with torch.no_grad():
        for start in range(0, PROMPT, CHUNK):
            logits, _ = qwen36.forward(cfg, weights, torch.tensor([prompt[start:start + CHUNK]]), qwen36.delta_rule_chunked, cache)
            for pos in SAMPLED:
                if start <= pos < start + CHUNK:
                    sampled[pos] = logits[0, pos - start]
        continuation, continuation_logits = [], []
        row = sampled[PROMPT - 1]
        for _ in range(CONTINUATION):
            token = int(row[:MAX_ID].argmax())
            continuation.append(token)
            logits, _ = qwen36.forward(cfg, weights, torch.tensor([[token]]), qwen36.delta_rule_recurrent, cache)
            row = logits[0, 0]
            continuation_logits.append(row)
    golden = {
        "generator": "tools/reference/make_long_golden.py (float64 reference tools/reference/qwen36.py)",
        "checkpoint": "ddflash testmodel --preset long-h256 --dtype bf16 --seed 1",
        "model_safetensors_sha256": file_sha256(os.path.join(checkpoint_dir, "model.safetensors")),
        "layout": "prompt_logits[i] are the logits at prompt position positions[i]; continuation_logits[i] are "
                  "those after feeding continuation[i] (the reference's greedy choice over ids below 300) "
                  "after the prompt and continuation[:i]",
        "prompt": prompt,
        "positions": list(SAMPLED),
        "prompt_logits": [sampled[p].tolist() for p in SAMPLED],
        "continuation": continuation,
        "continuation_logits": [r.tolist() for r in continuation_logits],
    }
    write_golden(out, golden)
    print(f"wrote {out}: continuation {continuation}")


if __name__ == "__main__":
    main()
