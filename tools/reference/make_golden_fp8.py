#!/usr/bin/python3
"""Writes golden.json for engine/testdata/golden-tiny-fp8: the golden-tiny checkpoint in Qwen's
FP8 layout (written by `ddflash quantize`), run by the float64 reference on its dequantised
weights, w = e4m3(q) · weight_scale_inv[i/128][j/128], for golden-tiny's token sequences.

Usage: make_golden_fp8.py [FP8_DIR [BF16_DIR]]
       (default engine/testdata/golden-tiny-fp8 and engine/testdata/golden-tiny)
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen36  # noqa: E402
from safetensors_io import write_golden  # noqa: E402

BLOCK = 128
SCALE_SUFFIX = "_scale_inv"


def dequantize(weights):
    """Replaces each FP8 weight and its block scales by the float64 product."""
    out = dict(weights)
    for name in [n for n in weights if n.endswith(SCALE_SUFFIX)]:
        base = name[: -len(SCALE_SUFFIX)]
        q, scale = out[base], out.pop(name)
        rows, cols = q.shape
        full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
        out[base] = q * full
    return out


def main():
    fp8_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("engine", "testdata", "golden-tiny-fp8")
    bf16_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join("engine", "testdata", "golden-tiny")
    torch.set_num_threads(2)
    cfg, weights = qwen36.load_checkpoint(fp8_dir)
    quantized = sum(1 for n in weights if n.endswith(SCALE_SUFFIX))
    assert quantized > 0, f"{fp8_dir} holds no FP8 weights"
    weights = dequantize(weights)
    with open(os.path.join(bf16_dir, "golden.json")) as f:
        bf16 = json.load(f)
    records, from_bf16 = [], 0.0
    with torch.no_grad():
        for seq in bf16["sequences"]:
            logits, hidden = qwen36.forward(cfg, weights, torch.tensor([seq["ids"]]), qwen36.delta_rule_recurrent)
            from_bf16 = max(from_bf16, (logits[0] - torch.tensor(seq["logits"], dtype=torch.float64)).abs().max().item())
            records.append({"ids": seq["ids"], "logits": logits[0].tolist(), "hidden": [h[0].tolist() for h in hidden]})
    golden = {
        "generator": "tools/reference/make_golden_fp8.py (float64 reference tools/reference/qwen36.py on the dequantised weights)",
        "checkpoint": f"config.json and model.safetensors in this directory ({quantized} FP8 linear layers, F32 block scales)",
        "layout": bf16["layout"],
        "checks": {"bf16_golden_logits_max_abs": from_bf16},
        "sequences": records,
    }
    write_golden(os.path.join(fp8_dir, "golden.json"), golden)
    print(f"wrote {fp8_dir}/golden.json: {quantized} FP8 matrices; logits differ from the bf16 golden by up to {from_bf16:.3g}")


if __name__ == "__main__":
    main()
