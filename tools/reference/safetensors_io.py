"""Hand-written safetensors reader and writer (Debian has no safetensors package).

Format: u64 little-endian header length, a JSON header mapping each tensor name to
{dtype, shape, data_offsets} (offsets relative to the end of the header), then the raw
little-endian bytes.
"""

import hashlib
import json
import os
import struct

import numpy as np
import torch

# Element sizes of the dtypes this project reads and writes.
_ITEM_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1}


def _e4m3_values() -> np.ndarray:
    """Every float8 E4M3 byte's value from the definition: sign, 4 exponent bits with bias 7
    (0: subnormal), 3 mantissa bits; 0x7f and 0xff are NaN. Exact in float32."""
    values = np.empty(256, dtype=np.float32)
    for b in range(256):
        exp, mant = (b >> 3) & 0xF, b & 7
        v = mant / 8 * 2.0**-6 if exp == 0 else (1 + mant / 8) * 2.0 ** (exp - 7)
        values[b] = float("nan") if b & 0x7F == 0x7F else (-v if b & 0x80 else v)
    return values


def _bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """BF16 is the top half of an IEEE float32, so widening is an exact shift."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _float32_to_bf16_bits(values: torch.Tensor) -> np.ndarray:
    """Round to nearest even (torch's conversion), then take the 16 stored bits."""
    return values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def read_header(path):
    """Returns (header dict without __metadata__, byte offset where the data starts)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def read_safetensors(path, names=None):
    """Loads tensors as float32 (exact for BF16, F16 and F8_E4M3, whose block scales the
    caller applies). names limits what is read."""
    header, data_start = read_header(path)
    tensors = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            if names is not None and name not in names:
                continue
            begin, end = info["data_offsets"]
            f.seek(data_start + begin)
            raw = f.read(end - begin)
            dtype = info["dtype"]
            if dtype == "BF16":
                values = _bf16_bits_to_float32(np.frombuffer(raw, dtype="<u2"))
            elif dtype == "F16":
                values = np.frombuffer(raw, dtype="<f2").astype(np.float32)
            elif dtype == "F32":
                values = np.frombuffer(raw, dtype="<f4").astype(np.float32)
            elif dtype == "F8_E4M3":
                values = _e4m3_values()[np.frombuffer(raw, dtype=np.uint8)]
            else:
                raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
            tensors[name] = torch.from_numpy(values.reshape(info["shape"]).copy())
    return tensors


def file_sha256(path):
    """The file's SHA-256, read 16 MiB at a time (checkpoints run to gigabytes). Goldens record
    it so that a test knows it regenerated the same checkpoint."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            sha.update(block)
    return sha.hexdigest()


def write_golden(path, golden, newline=True):
    """Writes a golden as compact JSON (and a final newline unless told not to), creating its
    directory."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        if newline:
            f.write("\n")


def write_safetensors(path, tensors, dtypes):
    """Writes tensors (name -> float tensor) with dtypes (name -> "BF16" | "F16" | "F32")."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        dtype = dtypes[name]
        values = tensors[name].detach().to(torch.float32).contiguous()
        if dtype == "BF16":
            blob = _float32_to_bf16_bits(values).astype("<u2").tobytes()
        elif dtype == "F16":
            blob = values.numpy().astype("<f2").tobytes()
        elif dtype == "F32":
            blob = values.numpy().astype("<f4").tobytes()
        else:
            raise ValueError(f"tensor {name}: unsupported dtype {dtype}")
        assert len(blob) == values.numel() * _ITEM_SIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(values.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # keep the data 8-byte aligned, as the reference writer does
    # Written under another name and renamed, so a stopped run never leaves a partial file.
    with open(path + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)
    os.replace(path + ".partial", path)
