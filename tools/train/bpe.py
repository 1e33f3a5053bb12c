"""A byte-level BPE tokenizer in the Qwen3.5 layout: NFC, the Qwen3.5 Split regex, GPT-2
byte↔unicode map, BPE merges, ByteLevel decoder. Trains on a corpus and writes a Hugging Face
tokenizer.json plus tokenizer_config.json (ChatML chat template, eos <|im_end|>).

Ids: 0..255 are the byte symbols (GPT-2 order), merge i creates id 256+i, and the added
(special) tokens take the last ids.
"""

import collections
import json
import os
import unicodedata

import regex

# The Qwen3.5 pre-tokenizer (docs/qwen36-model.md §8): Qwen2's regex with \p{M} in letter runs.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT = regex.compile(SPLIT_PATTERN)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def bytes_to_unicode():
    """GPT-2's map from each byte to a printable character, in GPT-2's id order: printable
    Latin-1 bytes map to themselves, the rest to U+0100 onwards."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def pre_tokenize(text):
    """NFC, then the Split regex (behaviour Isolated: every match is its own piece; the regex
    matches every character), then each piece's UTF-8 bytes as byte symbols."""
    return ["".join(BYTE_TO_CHAR[b] for b in piece.encode()) for piece in _SPLIT.findall(unicodedata.normalize("NFC", text))]


def _merge_pair(symbols, pair, merged):
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


class Tokenizer:
    def __init__(self, merges, special_tokens):
        self.merges = [tuple(m) for m in merges]
        self.vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR.values())}
        for a, b in self.merges:
            self.vocab[a + b] = len(self.vocab)
        assert len(self.vocab) == 256 + len(self.merges), "two merges produce the same token"
        self.special_ids = {tok: len(self.vocab) + i for i, tok in enumerate(special_tokens)}
        self.id_to_token = {i: t for t, i in self.vocab.items()} | {i: t for t, i in self.special_ids.items()}
        self._rank = {m: r for r, m in enumerate(self.merges)}
        self._special_split = regex.compile("(" + "|".join(regex.escape(t) for t in special_tokens) + ")")
        self._cache = {}

    @property
    def size(self):
        return len(self.id_to_token)

    @classmethod
    def train(cls, texts, num_merges, special_tokens):
        """Learns merges from texts (special tokens are split out first and never merged).
        Ties between equally frequent pairs go to the smaller pair, so training is deterministic."""
        splitter = regex.compile("|".join(regex.escape(t) for t in special_tokens))
        counts = collections.Counter()
        for text in texts:
            for segment in splitter.split(text):
                counts.update(pre_tokenize(segment))
        words = {tuple(w): n for w, n in counts.items()}
        merges = []
        for _ in range(num_merges):
            pairs = collections.Counter()
            for symbols, n in words.items():
                for pair in zip(symbols, symbols[1:]):
                    pairs[pair] += n
            best = min(pairs, key=lambda p: (-pairs[p], p))
            merges.append(best)
            words = {_merge_pair(s, best, best[0] + best[1]): n for s, n in words.items()}
        return cls(merges, special_tokens)

    def _encode_piece(self, piece):
        ids = self._cache.get(piece)
        if ids is None:
            symbols = tuple(piece)
            while len(symbols) > 1:
                pair = min(zip(symbols, symbols[1:]), key=lambda p: self._rank.get(p, len(self._rank)))
                if pair not in self._rank:
                    break
                symbols = _merge_pair(symbols, pair, pair[0] + pair[1])
            ids = self._cache[piece] = [self.vocab[s] for s in symbols]
        return ids

    def encode(self, text):
        """Special tokens in text are matched first, as the HF tokenizer does."""
        ids = []
        for segment in self._special_split.split(text):
            if segment in self.special_ids:
                ids.append(self.special_ids[segment])
            elif segment:
                for piece in pre_tokenize(segment):
                    ids.extend(self._encode_piece(piece))
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            token = self.id_to_token[i]
            out += token.encode() if token in self.special_ids else bytes(CHAR_TO_BYTE[c] for c in token)
        return out.decode(errors="replace")

    def save(self, directory, model_max_length, eos_token="<|im_end|>", pad_token="<|endoftext|>"):
        """Writes tokenizer.json and tokenizer_config.json in the Hugging Face format."""
        byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        added = [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for t, i in self.special_ids.items()
        ]
        tokenizer = {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
                    {"type": "ByteLevel", **byte_level},
                ],
            },
            "post_processor": {"type": "ByteLevel", **byte_level},
            "decoder": {"type": "ByteLevel", **byte_level},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": "",
                "end_of_word_suffix": "",
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": self.vocab,
                "merges": [list(m) for m in self.merges],
            },
        }
        config = {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
            "additional_special_tokens": [t for t in self.special_ids if t != pad_token],
            "bos_token": None,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": eos_token,
            "errors": "replace",
            "model_max_length": model_max_length,
            "pad_token": pad_token,
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }
        for name, body in (("tokenizer.json", tokenizer), ("tokenizer_config.json", config)):
            with open(os.path.join(directory, name), "w") as f:
                json.dump(body, f, ensure_ascii=False, indent=2)
                f.write("\n")
