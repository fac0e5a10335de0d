"""The plain walk: a format's fast read of a record in its common shape, with no Arrow call per record.

A reader's :meth:`prl.formats.base.Format.plain` pulls the record's scalar fields into a :class:`Sample` and its
token values out as the decoded JSON lists hold them (:class:`Plain`); ingest converts the lists of many records
to Arrow at once (:mod:`prl.ingestion.token_block`). The walk accepts only records whose every per-record step
would succeed in :meth:`~prl.formats.base.Format.parse` and returns None for anything else, so that record
goes through ``parse`` whole. What only the values can tell (an ID that is not an integer, a logprob that is
not a number, ``"token_id:N"`` tokens that disagree with the IDs, a top-k head) is checked on the converted
block; a record that fails there is read again by ``parse``, which gives its samples and reasons as always.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import methodcaller
from typing import Any

import pyarrow as pa

from prl.formats.base import Sample

NO_IDS = pa.array([], pa.int64())
NO_LOGPROBS = pa.array([], pa.float64())
"""Placeholders for a plain sample's token arrays: its token block holds them."""


@dataclass(slots=True)
class Plain:
    """One choice as the plain walk reads it. ``sample``: every field but the token arrays (placeholders);
    ``prompt`` / ``completion``: the JSON lists of token IDs. The logprobs come as one of two shapes: OpenAI
    chat ``logprobs.content`` objects (``entries``: ``{token, logprob, top_logprobs}`` per position) or
    completions ``token_logprobs`` numbers (``logprobs``, with the ``"token_id:N"`` strings of
    ``logprobs.tokens`` in ``spelled``). ``check_tokens``: whether ``parse`` compares the spelled tokens with
    ``completion`` (chat: where both have the same nonzero length and every token is spelled so;
    completions: where the first token is)."""

    sample: Sample
    prompt: list[Any]
    completion: list[Any]
    entries: list[Any] | None
    check_tokens: bool
    logprobs: list[Any] | None = None
    spelled: list[Any] | None = None
    tokens: int = 0
    """Prompt plus completion tokens."""

    def __post_init__(self) -> None:
        self.tokens = len(self.prompt) + len(self.completion)

    @property
    def values(self) -> int:
        """Values the block converts for this choice."""
        return self.tokens + len(self.entries if self.entries is not None else self.logprobs or ())


_LOGPROB = methodcaller("get", "logprob")


def holds_booleans(plain: Plain) -> bool:
    """Whether an entry's ``logprob`` is ``true``/``false`` (Arrow would read 1.0 / 0.0; ``parse`` says
    ``bad_logprob``). ``set(map(type, ...))``: C-level iteration over the record's entries, cheaper than
    searching its JSON text for the literals (a 1,600-token record: 55 µs against 92)."""
    if plain.entries is None:
        return bool in set(map(type, plain.logprobs or ()))
    try:
        return bool in set(map(type, map(_LOGPROB, plain.entries)))
    except (AttributeError, TypeError):  # an entry that is not an object: parse says what it is
        return True


__all__ = ["NO_IDS", "NO_LOGPROBS", "Plain", "holds_booleans"]
