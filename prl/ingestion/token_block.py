"""Token columns of many plain records (:mod:`prl.formats.plain`) built by one Arrow conversion per column.

The plain walk hands over each choice's JSON lists; :func:`convert` joins the lists of a run of records and
converts each column once: prompt and completion IDs (inferred: they must come out int64 with no nulls, as
``parse`` requires integers), the ``token_logprobs`` as float64 and the spelled ``"token_id:N"`` tokens as
strings. A row is then refused where ``parse`` would not read it the same way: spelled tokens that are not
exactly the completion IDs. Only when a column fails to convert are its lists converted one row at a time, to
find the rows that fail; the rest convert again without them.

A refused row's record goes back whole to ``parse`` (its JSON text decoded again), so its samples and
reasons are those ``parse`` gives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prl.formats.base import TOKEN_ID_PREFIX
from prl.formats.plain import Plain
from prl.numerics.ragged import any_per_row, offsets_of

CONVERSION_ERRORS = (ValueError, TypeError, OverflowError)
"""What a conversion of decoded JSON lists may raise: Arrow's errors (``ArrowInvalid`` is a ``ValueError``,
``ArrowTypeError`` a ``TypeError``), an integer beyond 64 bits, and a string holding a lone UTF-16 surrogate
(``UnicodeEncodeError``, a ``ValueError``). A row whose lists raise any of them goes to ``parse``, which
names its reason."""

BLOCK_VALUES = 1 << 17
"""Token values (prompt and completion IDs, logprobs) pending before a conversion: the records'
JSON text and lists are held until then."""


@dataclass(slots=True)
class TokenBlock:
    """Converted token columns of a run of plain rows: ``columns[name]`` is (values, int64[R+1] offsets) for
    ``prompt_token_ids`` / ``completion_token_ids`` (int64) and ``completion_logprobs`` (float64, nulls kept);
    the other token columns (mask, top-k heads) are null in every row."""

    columns: dict[str, tuple[pa.Array, np.ndarray]]

    def array(self, name: str, row: int) -> pa.Array | None:
        """Row ``row``'s array of column ``name`` (None for a column the block leaves null)."""
        if name not in self.columns:
            return None
        values, offsets = self.columns[name]
        return values.slice(int(offsets[row]), int(offsets[row + 1] - offsets[row]))


@dataclass(slots=True)
class PendingRecord:
    """A record the plain walk read, waiting for its block: where it is, its JSON text, the format that read
    it, its position (for :func:`prl.formats.guard.read_record` should it go back to ``parse``), its choices."""

    line: int
    raw: bytes
    name: str
    position: str | None
    plains: list[Plain]


@dataclass(slots=True)
class Converted:
    """A pending record after its block's conversion: ``block`` and ``first_row`` (its first choice's row;
    its choices are consecutive rows) when every choice converted, else ``block`` None (``parse`` reads it)."""

    record: PendingRecord
    block: TokenBlock | None
    first_row: int = 0


def _as_ids(values: list[Any]) -> pa.Array | None:
    """int64 IDs when every value is an integer (inferred: floats, booleans, strings, nulls and integers
    beyond 64 bits do not come out int64 without nulls), else None."""
    try:
        array = pa.array(values)
    except CONVERSION_ERRORS:
        return None
    if len(array) == 0:
        return pa.array([], pa.int64())
    return array if pa.types.is_int64(array.type) and array.null_count == 0 else None


def _column(lists: list[list[Any]], bad: np.ndarray, as_arrow: Callable[[list[Any]], pa.Array | None]) -> pa.Array:
    """Every row's list joined and converted by one ``as_arrow`` call, the rows in ``bad`` left out. Should
    that fail, each row is converted alone and the ones that fail are added to ``bad``."""

    def joined() -> pa.Array | None:
        kept = lists if not bad.any() else [[] if b else v for v, b in zip(lists, bad.tolist(), strict=True)]
        return as_arrow(list(chain.from_iterable(kept)))

    array = joined()
    if array is None:
        for row, values in enumerate(lists):
            bad[row] = bad[row] or as_arrow(values) is None
        array = joined()
    if array is None:  # cannot happen (rows that convert alone convert joined): every row goes to parse
        bad[:] = True
        array = as_arrow([])
    assert array is not None
    return array


def _lengths(lists: list[list[Any]], bad: np.ndarray) -> np.ndarray:
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    lengths[bad] = 0
    return lengths


def _as_logprobs(values: list[Any]) -> pa.Array | None:
    """Completions ``token_logprobs`` as float64 (nulls kept), as ``parse`` reads them (inferred: numbers and
    nulls), else None."""
    try:
        array = pa.array(values)
        if pa.types.is_null(array.type):
            return pa.nulls(len(array), pa.float64())
        if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
            return array.cast(pa.float64())
    except CONVERSION_ERRORS:
        pass
    return None


def _as_strings(values: list[Any]) -> pa.Array | None:
    try:
        return pa.array(values, pa.string())
    except CONVERSION_ERRORS:
        return None


def _misspelled(
    spelled: pa.Array, spelled_offsets: np.ndarray, completion: pa.Array, completion_offsets: np.ndarray
) -> np.ndarray:
    """bool[R]: completions rows whose ``logprobs.tokens`` (where ``parse`` compares them) are not exactly
    the completion IDs spelled ``"token_id:N"``."""
    spelled_lengths = np.diff(spelled_offsets)
    if not spelled_lengths.any():
        return np.zeros(len(spelled_lengths), dtype=bool)
    ids = completion.filter(pa.array(np.repeat(spelled_lengths > 0, np.diff(completion_offsets))))
    expected = pc.binary_join_element_wise(TOKEN_ID_PREFIX, pc.cast(ids, pa.string()), "")
    same = pc.fill_null(pc.equal(spelled, expected), False)
    return any_per_row(~np.asarray(same), spelled_offsets)


def convert(records: list[PendingRecord]) -> list[Converted]:
    """Convert the token lists of ``records`` (in source order) into one :class:`TokenBlock`."""
    plains = [plain for record in records for plain in record.plains]
    bad = np.zeros(len(plains), dtype=bool)
    prompts, completions = [p.prompt for p in plains], [p.completion for p in plains]
    values = [p.logprobs for p in plains]
    spelled = [p.spelled or [] for p in plains]
    while True:  # a row found bad in one column is left out of the others too
        before = bad.copy()
        prompt = _column(prompts, bad, _as_ids)
        completion = _column(completions, bad, _as_ids)
        logprobs = _column(values, bad, _as_logprobs)
        spelled_tokens = _column(spelled, bad, _as_strings)
        if (bad == before).all():
            break
    prompt_offsets = offsets_of(_lengths(prompts, bad))
    completion_offsets = offsets_of(_lengths(completions, bad))
    value_offsets = offsets_of(_lengths(values, bad))
    spelled_offsets = offsets_of(_lengths(spelled, bad))
    bad |= _misspelled(spelled_tokens, spelled_offsets, completion, completion_offsets)
    block = TokenBlock(
        {
            "prompt_token_ids": (prompt, prompt_offsets),
            "completion_token_ids": (completion, completion_offsets),
            "completion_logprobs": (logprobs, value_offsets),
        }
    )
    out: list[Converted] = []
    refused = bad.tolist()
    row = 0
    for record in records:
        rows = len(record.plains)
        out.append(Converted(record, None if any(refused[row : row + rows]) else block, row))
        row += rows
    return out


__all__ = ["BLOCK_VALUES", "Converted", "PendingRecord", "TokenBlock", "convert"]
