"""Shared pieces of the passes over shipped rows: worker count, cache-sized blocks of samples, loss masks and list
arrays built from flat numpy arrays.

Rows are gathered from the spill files (:class:`~prl.shards.spill.ScanSpill`) in final order, as flat arrays
(``_T``: one entry per completion token of the gathered rows) with ``offsets_N1`` (int64, N + 1). Per-token
numerics run over blocks of whole samples (:func:`blocks`), so their float64 temporaries stay in cache.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from prl.shards.spill import FlatList

WORKERS = 2
"""Threads that gather, assemble and write shards side by side (numpy, Arrow, Parquet and zstd release the GIL);
at most this many row groups (:mod:`prl.shards.rowgroups`) are in memory at once."""

BLOCK_TOKENS = 1 << 16
"""Per-token numerics run over blocks of whole samples of about this many tokens: their float64 temporaries
(512 KiB each) are reused from block to block and stay in cache instead of faulting in fresh pages."""


INPUT_IDS = ("prompt_token_ids", "completion_token_ids")
"""The trace columns gathered as one row-wise concatenation: a shard's ``input_ids``."""


def blocks(offsets_N1: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges ``[r0, r1)`` cutting samples into blocks of about :data:`BLOCK_TOKENS` tokens (a longer sample
    is a block of its own)."""
    n = len(offsets_N1) - 1
    cuts = np.searchsorted(offsets_N1, np.arange(0, int(offsets_N1[-1]), BLOCK_TOKENS), side="right") - 1
    cuts = np.unique(np.concatenate((cuts[cuts < n], [n])))
    if cuts[0] != 0:
        cuts = np.concatenate(([0], cuts))
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))


def mask_column(has_mask_N: np.ndarray) -> list[str]:
    """``["completion_mask"]`` when one of the rows has a mask, else nothing to gather."""
    return ["completion_mask"] if has_mask_N.any() else []


def mask_T(masks: FlatList | None, off: np.ndarray) -> np.ndarray:
    """``mask_T`` (bool, aligned to the completions bounded by ``off``): each row's ``completion_mask``, all True
    for rows without one (and for every row when ``masks`` is None); a null inside a mask is False."""
    if masks is None or (masks.row_valid_N is not None and not masks.row_valid_N.any()):
        return np.ones(int(off[-1]), dtype=bool)
    vals = masks.values_T if masks.valid_T is None else masks.values_T & masks.valid_T
    if masks.row_valid_N is None:
        return vals
    # rows with a mask: lengths equal completion lengths (checked in the plan), so their values fill exactly
    # those rows' positions, in order (a null row is empty in the gathered values)
    out = np.ones(int(off[-1]), dtype=bool)
    out[np.repeat(masks.row_valid_N, np.diff(off))] = vals
    return out


def list_array(
    values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType, valid: np.ndarray | None = None
) -> pa.ListArray:
    """A list array of ``values`` (flat, numpy) bounded by ``offsets`` (N + 1), nulls where ``valid`` is False.
    Bools are packed with numpy (Arrow packs a numpy bool array one value at a time)."""
    if value_type == pa.bool_() and valid is None:
        bits = pa.py_buffer(np.packbits(values, bitorder="little"))
        arr = pa.Array.from_buffers(pa.bool_(), len(values), [None, bits])
    else:
        arr = pa.array(values, type=value_type, mask=None if valid is None else ~valid)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), arr)


__all__ = ["BLOCK_TOKENS", "INPUT_IDS", "WORKERS", "blocks", "list_array", "mask_T", "mask_column"]
