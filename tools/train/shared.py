"""Paths, the tokenizer's special tokens and the corpus token streams shared by the training
and evaluation scripts."""

import json
import math
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))

TARGET_DIR = os.path.join(REPO, "models", "default", "target")
DRAFT_DIR = os.path.join(REPO, "models", "default", "draft")
# Intermediate files (greedy continuations, float32 checkpoints, logs) stay out of the tree.
CACHE_DIR = os.environ.get("DDFLASH_TRAIN_CACHE", "/tmp/ddflash-train")

ENDOFTEXT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, MASK]  # they take the last ids of the vocabulary
VOCAB_SIZE = 512

import bpe  # noqa: E402
import corpus  # noqa: E402


def setup_torch(seed):
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    os.makedirs(CACHE_DIR, exist_ok=True)


def load_tokenizer():
    with open(os.path.join(TARGET_DIR, "tokenizer.json")) as f:
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
