"""Row groups of a shard: runs of whole groups of about :data:`ROW_GROUP_TOKENS` tokens.

A shard is assembled and written one row group at a time (:meth:`prl.shards.parts.PartJob.write`), so a worker
holds one row group's gathered token columns and table, not a whole shard's: the shard writing's memory follows
:data:`ROW_GROUP_TOKENS`, not ``target_tokens``. A group belongs to the row group in whose
:data:`ROW_GROUP_TOKENS` window (counted from the shard's first token) its first token falls, the rule
:func:`prl.shards.plan.pack` uses for shards: groups stay whole, so a reader that takes one row group at a time
still sees every sample of a group together, and a group longer than the window is a row group of its own.
"""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl

ROW_GROUP_TOKENS = 1 << 20
"""Prompt + completion tokens per row group of a shard (about: a row group ends with a whole group). With merged
turns the window counts the turns' own tokens, more than their merged rows hold, so those row groups are
smaller."""


def row_groups(group_id: pl.Series, tokens_N: np.ndarray, limit: int = ROW_GROUP_TOKENS) -> list[tuple[int, int]]:
    """Row ranges ``[r0, r1)`` cutting a shard's rows (final order: each group one run of ``group_id``, nulls
    equal) into row groups of whole groups, each group in the ``limit``-token window of its first token
    (``tokens_N``: prompt + completion tokens of each row, int). One range for a shard within one window; none
    for no rows."""
    n = len(group_id)
    if n == 0:
        return []
    runs_N = group_id.rle_id().to_numpy()  # polars: the run of equal values each row is in, nulls equal
    first_G = np.flatnonzero(np.diff(runs_N, prepend=-1))
    start_N = np.concatenate(([0], np.cumsum(np.asarray(tokens_N, dtype=np.int64))[:-1]))
    window_G = start_N[first_G] // limit  # nondecreasing
    cuts = first_G[np.flatnonzero(np.diff(window_G)) + 1]
    edges = [0, *cuts.tolist(), n]
    return list(itertools.pairwise(edges))


__all__ = ["ROW_GROUP_TOKENS", "row_groups"]
