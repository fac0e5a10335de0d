"""tiktoken BPE files (the vocabulary format of gpt-oss, Kimi and the original Qwen release) as a Rust
``tokenizers.Tokenizer``, so the token checks run on them exactly as on a ``tokenizer.json``.

A tiktoken file holds one ``<base64 token bytes> <rank>`` line per token, nothing else: the pre-tokenizer
pattern and the special tokens live in the model's code or config. Here they come from the model folder's
``tokenizer_config.json`` (``added_tokens_decoder``; a ``pat_str`` key when present) or from the caller
(``pattern``, ``special_tokens``); without a pattern the file is refused, since a wrong one splits text
differently from the model. The file is parsed here (no loader that could fetch a URL), and nothing runs
the model's own code.

The BPE model is tiktoken's: merge ranks are the token ranks, every token of two or more bytes is the merge of
the pairs of shorter tokens it splits into (in rank order), and a pre-token that is itself in the vocabulary is
taken whole (``ignore_merges``); bytes map to text by GPT-2's byte-level alphabet.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from prl.errors import UsageError

TIKTOKEN_NAMES = ("tiktoken.model", "qwen.tiktoken")
"""File names a model folder uses for its tiktoken vocabulary (Kimi, Qwen); any ``*.tiktoken`` also counts."""


def is_tiktoken_file(path: str) -> bool:
    """Whether ``path`` is a tiktoken BPE file: its first line is ``<base64> <integer>``."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(4096).split()
    except OSError:
        return False
    if len(first) != 2 or not first[1].isdigit():
        return False
    try:
        base64.b64decode(first[0], validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def tiktoken_file_in(folder: str) -> str | None:
    """The tiktoken vocabulary of a model folder, if it has one."""
    names = [n for n in TIKTOKEN_NAMES if os.path.isfile(os.path.join(folder, n))]
    names += sorted(n for n in os.listdir(folder) if n.endswith(".tiktoken") and n not in names)
    return os.path.join(folder, names[0]) if names else None


def read_ranks(path: str) -> dict[bytes, int]:
    """token bytes → rank, from a tiktoken file. Raises :class:`UsageError` naming the first bad line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except (ValueError, binascii.Error):
                raise UsageError(f"{path}:{number} is not a '<base64> <rank>' tiktoken line") from None
    return ranks


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what byte-level BPE vocabularies use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}


def bpe_tokenizer(path: str, pattern: str, special_tokens: Mapping[int, Mapping[str, Any]] | None = None) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` equal to tiktoken's encoding of ``path`` with ``pattern``.

    ``special_tokens``: ID → ``added_tokens_decoder`` entry (``content``, ``special``, ``lstrip``, ``rstrip``,
    ``single_word``), added at exactly those IDs (they must follow the ranks without gaps)."""
    ranks = read_ranks(path)
    table = str.maketrans({chr(b): c for b, c in _byte_alphabet().items()})
    texts = {token: token.decode("latin-1").translate(table) for token in ranks}  # bytes → byte-level text
    vocab = {texts[token]: rank for token, rank in ranks.items()}
    merges: list[tuple[int, str, str, int, int]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left is not None and right is not None:
                merges.append((rank, texts[token[:cut]], texts[token[cut:]], left, right))
    merges.sort(key=lambda m: (m[0], m[3], m[4]))
    model = BPE(vocab, [(left, right) for _, left, right, _, _ in merges], fuse_unk=False, ignore_merges=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    for token_id, entry in sorted((special_tokens or {}).items()):
        expected = tokenizer.get_vocab_size(with_added_tokens=True)
        if int(token_id) != expected:
            raise UsageError(
                f"special token {entry.get('content')!r} has ID {token_id}, the next free ID is {expected}"
            )
        added = AddedToken(
            str(entry["content"]),
            special=bool(entry.get("special", True)),
            lstrip=bool(entry.get("lstrip", False)),
            rstrip=bool(entry.get("rstrip", False)),
            single_word=bool(entry.get("single_word", False)),
            normalized=False,
        )
        tokenizer.add_special_tokens([added]) if added.special else tokenizer.add_tokens([added])
    return tokenizer


def added_tokens_of(config: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """``added_tokens_decoder`` of a ``tokenizer_config.json``, keyed by integer ID."""
    found = config.get("added_tokens_decoder")
    if not isinstance(found, dict):
        return {}
    return {int(k): v for k, v in found.items() if str(k).isdigit() and isinstance(v, dict) and "content" in v}
