"""Fixed-k sampler heads for score centering (docs/design.md), over Arrow list arrays.

A head is the sampler's top-k at one completion position: ``topk_ids`` and their full-vocabulary
``topk_logprobs``, sorted by logprob, descending. Traces store them as ``list<list<…>>`` per sample
(``[completion_len][k]``); servers may return different widths (vLLM's ``--max-logprobs``, a ``k + 1`` dict that
also holds the sampled token), so shards make k fixed.

Convention:

- Truncation keeps the first k entries of each position (the k most likely, since heads are sorted).
- Padding (only in :func:`fixed_k`, for positions narrower than k) fills ids with ``-1`` and logprobs with
  ``-inf`` (probability 0: it adds nothing to Σexp and never matches a token).
- A shard set never holds padded heads. ``topk = "auto"`` sets the set's k to the narrowest head among the samples
  that ship; an explicit ``topk = k`` drops samples whose narrowest position holds fewer than k entries (reason
  ``heads_too_narrow``); with either, samples without heads are dropped (``missing_heads``). The manifest records
  k. So every row of a set with heads has exactly k entries at every completion position.

Shapes: ``_N`` per sample, ``_P`` per position (all completion positions of all samples, flat), ``_PK`` per
position and head entry.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PAD_ID = -1
PAD_LOGPROB = float("-inf")


def _as_list_array(array: pa.Array | pa.ChunkedArray) -> pa.ListArray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks else pa.array([], array.type)
    return array


def min_head_width(topk: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``width_N`` int64: the narrowest head of each sample; -1 where a sample has no heads (null) and
    ``np.iinfo(int64).max`` for a sample with heads but no completion positions."""
    topk = _as_list_array(topk)
    n = len(topk)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    positions_N = pc.list_value_length(topk).fill_null(0).to_numpy().astype(np.int64)
    inner = pc.list_flatten(topk)
    widths_P = pc.list_value_length(inner).fill_null(0).to_numpy().astype(np.int64)
    big = np.iinfo(np.int64).max
    width_N = np.full(n, big, dtype=np.int64)
    nonempty = positions_N > 0
    if nonempty.any():
        starts = np.concatenate(([0], np.cumsum(positions_N)[:-1]))[nonempty]
        width_N[nonempty] = np.minimum.reduceat(widths_P, starts)
    width_N[~topk.is_valid().to_numpy(zero_copy_only=False)] = -1
    return width_N


def fixed_k(topk: pa.Array | pa.ChunkedArray, k: int, pad: float | int) -> pa.ListArray:
    """``topk`` (``list<list<T>>``) with every position cut or padded to exactly ``k`` entries.

    ``pad`` fills positions narrower than k (use :data:`PAD_ID` for ids, :data:`PAD_LOGPROB` for logprobs).
    Null samples stay null; a null position counts as width 0. Vectorized: one gather of ``P × k`` values.
    """
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    topk = _as_list_array(topk)
    value_type = topk.type.value_type.value_type
    outer_offsets = topk.offsets.to_numpy()
    inner_all = topk.values  # every position, including those of null samples (offsets skip them)
    inner_offsets_P1 = inner_all.offsets.to_numpy().astype(np.int64)
    widths_P = np.diff(inner_offsets_P1)
    if inner_all.null_count:
        widths_P = np.where(inner_all.is_valid().to_numpy(zero_copy_only=False), widths_P, 0)
    values = inner_all.values.to_numpy(zero_copy_only=False)
    cols_K = np.arange(k, dtype=np.int64)
    take_PK = inner_offsets_P1[:-1, None] + cols_K[None, :]
    inside_PK = cols_K[None, :] < widths_P[:, None]
    np.minimum(take_PK, max(len(values) - 1, 0), out=take_PK)
    flat = (np.where(inside_PK, values[take_PK], pad) if len(values) else np.full(take_PK.shape, pad)).astype(
        value_type.to_pandas_dtype()
    )
    inner = pa.ListArray.from_arrays(
        pa.array(np.arange(0, flat.size + 1, k, dtype=np.int32)), pa.array(flat.reshape(-1), value_type)
    )
    mask = pa.array(~topk.is_valid().to_numpy(zero_copy_only=False)) if topk.null_count else None
    return pa.ListArray.from_arrays(pa.array(outer_offsets), inner, mask=mask)
