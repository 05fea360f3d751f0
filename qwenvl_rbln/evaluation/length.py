"""A question far beyond the artifact's context is refused at once, before any tokenizing (new-user audit: a 50 MB
question took 5 minutes to be tokenized and then failed as too long, and its results line held it twice).

The check is a bound, not a guess: no token of the artifact's tokenizer stands for more UTF-8 bytes than its
longest vocabulary entry (in UTF-8: the byte-level BPE alphabet writes each byte as one character of one or two
bytes, sentencepiece's ``▁`` is three bytes for one space), so a prompt of more than ``longest x max_seq_len``
bytes cannot fit whatever the tokenizer does. Prompts under it run, and the batch job's own count decides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError, raise_all
from qwenvl_rbln.evaluation.items import EvalItem

FALLBACK_BYTES_PER_TOKEN = 1024  # no tokenizer.json to read: a bound no tokenizer reaches
EXCERPT_CHARS = 2000  # question and prompt kept in R.jsonl at most (R.requests.jsonl has the whole prompt)


def bytes_per_token(directory: Path) -> int:
    """The UTF-8 length of the longest entry of ``directory/tokenizer.json`` (vocabulary and added tokens)."""
    try:
        data: Any = json.loads((directory / "tokenizer.json").read_bytes())
        vocab = data["model"]["vocab"]
        pieces = list(vocab) if isinstance(vocab, dict) else [entry[0] for entry in vocab]
        pieces += [t["content"] for t in data.get("added_tokens") or []]
        return max(len(str(p).encode("utf-8")) for p in pieces) or FALLBACK_BYTES_PER_TOKEN
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return FALLBACK_BYTES_PER_TOKEN


def check_lengths(items: list[EvalItem], max_seq_len: int, directory: Path) -> None:
    """Refuse, naming each, the questions whose prompt has more bytes than ``max_seq_len`` tokens can hold."""
    per_token = bytes_per_token(directory)
    limit = per_token * max_seq_len
    problems = []
    for item in items:
        size = len(item.prompt().encode("utf-8", "surrogatepass"))
        if size > limit:
            problems.append(
                InputError(
                    f"question '{item.id}': its prompt is {size:,} bytes, more than {max_seq_len:,} tokens "
                    f"(the artifact's max_seq_len) can hold: no token of its tokenizer is longer than {per_token} "
                    "bytes",
                    "shorten the question or leave it out of the set",
                )
            )
    raise_all(problems, f"questions too long for {directory}", "correct each one listed; nothing ran")


def excerpt(text: str) -> str:
    """``text`` when short; else its first EXCERPT_CHARS characters and how long it was."""
    if len(text) <= EXCERPT_CHARS:
        return text
    return f"{text[:EXCERPT_CHARS]}... [{len(text):,} characters in all; the whole prompt is in R.requests.jsonl]"
