"""The training corpus: the King James Bible from Debian's bible-kjv package (public domain).

Each chapter becomes one ChatML exchange, so the trained model also learns the chat frame and
ends its answers with <|im_end|>:

    <|im_start|>user\\nGenesis 1<|im_end|>\\n<|im_start|>assistant\\n<verses, one a line><|im_end|>\\n<|endoftext|>

Every HELD_OUT_EVERY-th chapter is held out for evaluation.
"""

import re
import subprocess

HELD_OUT_EVERY = 20
_VERSE = re.compile(r"^\s+\d+ (.*)$")


def read_chapters():
    """Returns [(title, [verse, ...])] for the whole Bible, in order. The `bible` output puts
    each chapter heading between blank lines, starts verses with an indented number and
    wraps long verses onto unindented lines."""
    text = subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True).stdout
    chapters = []
    after_blank = True
    for line in text.splitlines():
        verse = _VERSE.match(line)
        if not line.strip():
            after_blank = True
            continue
        if verse:
            chapters[-1][1].append(verse.group(1).strip())
        elif after_blank:
            chapters.append((line.strip(), []))
        else:
            chapters[-1][1][-1] += " " + line.strip()
        after_blank = False
    return chapters


def chat_document(title, verses):
    return f"<|im_start|>user\n{title}<|im_end|>\n<|im_start|>assistant\n" + "\n".join(verses) + "<|im_end|>\n<|endoftext|>"


def split_documents():
    """Returns (train documents, held-out documents)."""
    chapters = read_chapters()
    train = [chat_document(*c) for i, c in enumerate(chapters) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    held_out = [chat_document(*c) for i, c in enumerate(chapters) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    return train, held_out
