"""Scores and group-relative advantages (docs/design.md), as pure functions over numpy arrays.

Shapes are in the names: ``_N`` is one entry per sample, ``_G`` one per centering group, ``_F`` one per
fallback group. ``group_index_N`` holds dense group numbers in ``[0, G)`` (see :func:`dense_index`).

Methods (verl ``compute_grpo_outcome_advantage`` / ``compute_rloo_outcome_advantage``, tinker-cookbook
``compute_advantages``):

- ``mean`` (default): ``A_i = r_i − mean_g(r)``
- ``loo`` (leave-one-out, RLOO): ``A_i = r_i − (Σ_g r − r_i)/(G − 1)``
- ``std``: ``A_i = (r_i − μ_g)/(σ_g + 1e-6)`` with the unbiased (``ddof = 1``) standard deviation

Groups of one have no baseline of their own. They take it from a wider *fallback* group (``fallback_index_N``:
the whole batch, or a field such as a task name), with the same method applied over every sample of that
fallback group. A singleton whose fallback group is also of size one (or when no fallback is given) gets
advantage 0. Everything is computed with ``np.bincount`` segment sums: no per-group Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

METHODS = ("mean", "loo", "std")
STD_EPS = 1e-6


def dense_index(keys: pa.Array | pa.ChunkedArray | np.ndarray) -> tuple[np.ndarray, int]:
    """Dense group numbers for arbitrary keys: ``(group_index_N int64, G)``; equal keys share a number.

    Numbers follow first appearance. Nulls form one group of their own.
    """
    if isinstance(keys, np.ndarray):
        keys = pa.array(keys)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks else pa.array([], keys.type)
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64), 0
    encoded = keys.dictionary_encode(null_encoding="encode")
    index_N = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return index_N, len(encoded.dictionary)


def combine_rewards(components: Mapping[str, np.ndarray], weights: Mapping[str, float]) -> np.ndarray:
    """The score ``Σ_c w_c · r_c`` of named reward components.

    ``components`` maps a name to its ``values_N`` (float64, NaN where missing); every weighted name must be
    present. Returns ``rewards_N`` float64; NaN where any weighted component is missing, ±inf/NaN propagate so the
    caller can drop them.
    """
    if not weights:
        raise ValueError("at least one reward component needs a weight")
    total_N: np.ndarray | None = None
    for name, weight in weights.items():
        if name not in components:
            raise KeyError(name)
        term_N = np.asarray(components[name], dtype=np.float64) * float(weight)
        total_N = term_N if total_N is None else total_N + term_N
    assert total_N is not None
    return total_N


def constant_groups(rewards_N: np.ndarray, group_index_N: np.ndarray, num_groups: int) -> np.ndarray:
    """``is_constant_G``: True for groups of two or more samples whose rewards are all exactly equal."""
    rewards_N = np.asarray(rewards_N, dtype=np.float64)
    count_G = np.bincount(group_index_N, minlength=num_groups)
    if len(rewards_N) == 0:
        return np.zeros(num_groups, dtype=bool)
    max_G = np.full(num_groups, -np.inf)
    min_G = np.full(num_groups, np.inf)
    np.maximum.at(max_G, group_index_N, rewards_N)
    np.minimum.at(min_G, group_index_N, rewards_N)
    return (count_G >= 2) & (max_G == min_G)


def _centered(rewards_N: np.ndarray, index_N: np.ndarray, num: int, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Advantages of every sample against its own segment, and the segment sizes per sample."""
    count_S = np.bincount(index_N, minlength=num).astype(np.float64)
    sum_S = np.bincount(index_N, weights=rewards_N, minlength=num)
    count_N = count_S[index_N]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_N = (sum_S / count_S)[index_N]
        if method == "mean":
            adv_N = rewards_N - mean_N
        elif method == "loo":
            adv_N = rewards_N - (sum_S[index_N] - rewards_N) / (count_N - 1.0)
        else:  # std
            dev_N = rewards_N - mean_N
            var_S = np.bincount(index_N, weights=dev_N * dev_N, minlength=num) / (count_S - 1.0)
            adv_N = dev_N / (np.sqrt(var_S)[index_N] + STD_EPS)
    adv_N = np.where(count_N >= 2, adv_N, 0.0)
    return adv_N, count_N


@dataclass
class Advantages:
    """Result of :func:`compute_advantages`.

    ``advantages_N`` float64 (NaN where ``keep_N`` is False); ``group_size_N`` int32, the size of each sample's
    own group among kept samples; ``keep_N`` bool; counts of what happened.
    """

    advantages_N: np.ndarray
    group_size_N: np.ndarray
    keep_N: np.ndarray
    singleton_groups: int
    """Groups of one (each took the fallback baseline when one was given)."""
    singletons_without_baseline: int
    """Of those, how many had no wider group of two or more to compare with (advantage 0)."""
    constant_groups_dropped: int
    constant_samples_dropped: int


def compute_advantages(
    rewards_N: np.ndarray,
    group_index_N: np.ndarray,
    method: str = "mean",
    fallback_index_N: np.ndarray | None = None,
    drop_constant: bool = False,
) -> Advantages:
    """Group-relative advantages of finite ``rewards_N`` (float64) grouped by ``group_index_N`` (int, dense).

    ``fallback_index_N`` (dense ints, e.g. all zeros for the whole batch) gives the baseline for groups of one;
    None means singletons get advantage 0. With ``drop_constant``, samples of groups (size ≥ 2) whose rewards are
    all equal are dropped first; advantages (and fallback baselines) are then computed over kept samples only.
    """
    if method not in METHODS:
        raise ValueError(f"unknown advantage method {method!r}; expected one of {', '.join(METHODS)}")
    rewards_N = np.asarray(rewards_N, dtype=np.float64)
    group_index_N = np.asarray(group_index_N, dtype=np.int64)
    n = len(rewards_N)
    if len(group_index_N) != n or (fallback_index_N is not None and len(fallback_index_N) != n):
        raise ValueError("rewards, group index and fallback index must have the same length")
    if n and not np.isfinite(rewards_N).all():
        raise ValueError("rewards must be finite; drop NaN/inf rewards before computing advantages")
    num_groups = int(group_index_N.max()) + 1 if n else 0

    keep_N = np.ones(n, dtype=bool)
    dropped_groups = 0
    if drop_constant and n:
        const_G = constant_groups(rewards_N, group_index_N, num_groups)
        keep_N = ~const_G[group_index_N]
        dropped_groups = int(const_G.sum())

    kept = np.flatnonzero(keep_N)
    r_K = rewards_N[kept]
    g_K = group_index_N[kept]
    adv_K, size_K = _centered(r_K, g_K, num_groups, method)
    single_K = size_K == 1
    singletons = int(single_K.sum())
    without = singletons
    if fallback_index_N is not None and singletons:
        f_K = np.asarray(fallback_index_N, dtype=np.int64)[kept]
        num_f = int(f_K.max()) + 1 if len(f_K) else 0
        fb_adv_K, fb_size_K = _centered(r_K, f_K, num_f, method)
        adv_K = np.where(single_K, fb_adv_K, adv_K)
        without = int((single_K & (fb_size_K < 2)).sum())

    advantages_N = np.full(n, np.nan)
    advantages_N[kept] = adv_K
    group_size_N = np.zeros(n, dtype=np.int32)
    group_size_N[kept] = size_K.astype(np.int32)
    return Advantages(
        advantages_N=advantages_N,
        group_size_N=group_size_N,
        keep_N=keep_N,
        singleton_groups=singletons,
        singletons_without_baseline=without,
        constant_groups_dropped=dropped_groups,
        constant_samples_dropped=int(n - len(kept)),
    )
