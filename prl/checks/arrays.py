"""Ragged-array helpers shared by the checks: Arrow list columns as flat numpy values plus offsets, and the
per-row reductions the checks use. Everything is vectorized; no per-token Python.

A ragged column of ``R`` rows is ``(values_T, offsets_R1)``: row ``r`` holds
``values[offsets[r]:offsets[r+1]]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Ragged:
    """A list column as flat values, offsets (int64, length R+1) and a row-validity mask.

    ``valid_R`` is False where the list itself is null (then the row holds no values)."""

    values: np.ndarray
    offsets: np.ndarray
    valid: np.ndarray
    nulls: np.ndarray | None = None
    """bool per value, True where the value is null (None when the column has no null values)."""

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def row_of(self) -> np.ndarray:
        """int64 per value: the row it belongs to."""
        return np.repeat(np.arange(self.rows, dtype=np.int64), self.lengths)

    @property
    def position(self) -> np.ndarray:
        """int64 per value: its index inside its row."""
        return np.arange(len(self.values), dtype=np.int64) - np.repeat(self.offsets[:-1], self.lengths)

    def row(self, r: int) -> np.ndarray:
        return self.values[self.offsets[r] : self.offsets[r + 1]]


def ragged(column: pa.Array | pa.ChunkedArray, dtype: type | np.dtype, fill: float | int = 0) -> Ragged:
    """Flatten a ``list<T>`` column. Null lists become empty rows; null values become ``fill`` (see
    ``nulls``)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(column)
    nulls = None
    if flat.null_count:
        nulls = flat.is_null().to_numpy(zero_copy_only=False)
        flat = pc.fill_null(flat, fill)
    values = flat.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return Ragged(values, offsets, valid, nulls)


def first_per_row(mask_T: np.ndarray, rag: Ragged) -> np.ndarray:
    """For a bool mask over a ragged column's values: the first in-row position where it holds, per row
    (int64[R], -1 where it never holds)."""
    out = np.full(rag.rows, -1, dtype=np.int64)
    hits = np.flatnonzero(mask_T)
    if len(hits) == 0:
        return out
    rows = np.searchsorted(rag.offsets, hits, side="right") - 1
    uniq, first = np.unique(rows, return_index=True)
    out[uniq] = hits[first] - rag.offsets[uniq]
    return out


def count_per_row(mask_T: np.ndarray, rag: Ragged) -> np.ndarray:
    """Number of True values per row (int64[R])."""
    hits = np.flatnonzero(mask_T)
    rows = np.searchsorted(rag.offsets, hits, side="right") - 1
    return np.bincount(rows, minlength=rag.rows).astype(np.int64)


def longest_run_per_row(mask_T: np.ndarray, rag: Ragged) -> np.ndarray:
    """Length of the longest run of consecutive True values inside each row (int64[R])."""
    n = len(mask_T)
    out = np.zeros(rag.rows, dtype=np.int64)
    if n == 0 or not mask_T.any():
        return out
    m = mask_T.astype(np.int8)
    starts_row = np.zeros(n, dtype=bool)
    nonempty = rag.offsets[:-1][rag.lengths > 0]
    starts_row[nonempty] = True
    prev = np.concatenate(([0], m[:-1]))
    prev[starts_row] = 0
    run_start = (m == 1) & (prev == 0)
    nxt = np.concatenate((m[1:], [0]))
    ends_row = np.zeros(n, dtype=bool)
    ends_row[rag.offsets[1:][rag.lengths > 0] - 1] = True
    nxt[ends_row] = 0
    run_end = (m == 1) & (nxt == 0)
    s = np.flatnonzero(run_start)
    e = np.flatnonzero(run_end)
    lengths = e - s + 1
    rows = np.searchsorted(rag.offsets, s, side="right") - 1
    np.maximum.at(out, rows, lengths)
    return out


def concat_rows(a: Ragged, b: Ragged) -> Ragged:
    """Row-wise concatenation ``a[r] + b[r]`` (values of ``a``'s dtype)."""
    la, lb = a.lengths, b.lengths
    offsets = np.zeros(a.rows + 1, dtype=np.int64)
    np.cumsum(la + lb, out=offsets[1:])
    values = np.empty(offsets[-1], dtype=a.values.dtype)
    values[np.repeat(offsets[:-1], la) + a.position] = a.values
    values[np.repeat(offsets[:-1] + la, lb) + b.position] = b.values
    return Ragged(values, offsets, a.valid & b.valid)
