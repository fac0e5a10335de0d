"""The plain walk: the fast read of a text completion (``/v1/completions``) in its common shape, with no Arrow
call per record. (Chat completions have the columnar road instead: :mod:`prl.ingestion.columnar`.)

A reader's :meth:`prl.formats.base.Format.plain` pulls the record's scalar fields into a :class:`Sample` and its
token values out as the decoded JSON lists hold them (:class:`Plain`); ingest converts the lists of many records
to Arrow at once (:mod:`prl.ingestion.token_block`). The walk accepts only records whose every per-record step
would succeed in :meth:`~prl.formats.base.Format.parse` and returns None for anything else, so that record
goes through ``parse`` whole. What only the values can tell (an ID that is not an integer, a logprob that is
not a number, ``"token_id:N"`` tokens that disagree with the IDs) is checked on the converted block; a record
that fails there is read again by ``parse``, which gives its samples and reasons as always.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from prl.formats.base import Sample

NO_IDS = pa.array([], pa.int64())
NO_LOGPROBS = pa.array([], pa.float64())
"""Placeholders for a plain sample's token arrays: its token block holds them."""


@dataclass(slots=True)
class Plain:
    """One choice of a text completion as the plain walk reads it. ``sample``: every field but the token
    arrays (placeholders); ``prompt`` / ``completion``: the JSON lists of token IDs; ``logprobs``: the
    ``token_logprobs`` numbers; ``spelled``: the ``"token_id:N"`` strings of ``logprobs.tokens`` where
    ``parse`` compares them with ``completion`` (where the first token is so spelled and they are as many),
    else None."""

    sample: Sample
    prompt: list[Any]
    completion: list[Any]
    logprobs: list[Any]
    spelled: list[Any] | None = None
    tokens: int = 0
    """Prompt plus completion tokens."""

    def __post_init__(self) -> None:
        self.tokens = len(self.prompt) + len(self.completion)

    @property
    def values(self) -> int:
        """Values the block converts for this choice."""
        return self.tokens + len(self.logprobs)


def holds_booleans(plain: Plain) -> bool:
    """Whether a logprob is ``true``/``false`` (Arrow would read 1.0 / 0.0; ``parse`` says ``bad_logprob``).
    ``set(map(type, ...))``: C-level iteration over the record's values."""
    return bool in set(map(type, plain.logprobs))


__all__ = ["NO_IDS", "NO_LOGPROBS", "Plain", "holds_booleans"]
