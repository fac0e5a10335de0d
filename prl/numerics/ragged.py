"""Ragged-array arithmetic shared by the batch readers: offsets from lengths, and per-row reductions of flat
flags over those offsets (numpy, no per-row Python)."""

from __future__ import annotations

import numpy as np


def offsets_of(lengths: np.ndarray | list[int]) -> np.ndarray:
    """int64[N+1] start offsets of N consecutive rows of the given lengths (the last one is the total)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def any_per_row(flags: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """bool[N]: whether any of ``flags`` (bool[T]) is set within each row ``[offsets[i], offsets[i+1])``."""
    counts = np.zeros(len(flags) + 1, dtype=np.int64)
    np.cumsum(flags, out=counts[1:])
    return counts[offsets[1:]] > counts[offsets[:-1]]


__all__ = ["any_per_row", "offsets_of"]
