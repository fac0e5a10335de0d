"""Scores of the shipped samples: KL into the reward or the batch mean log ratio, then group-relative advantages
(docs/design.md), computed over exactly the rows that ship, in final order.

With ``kl = "reward"``, a pass over the spilled rows sums each sample's per-token KL (:func:`log_ratio_totals`);
with ``kl = "advantages"`` only the batch mean of ``d = log q − log p_ref`` is needed, and the plan scans already
summed each side of every sample whose tokens all count, so only the other samples (a loss mask, a missing or
non-finite logprob) are read again. The formulas are :mod:`prl.numerics.kl` and :mod:`prl.numerics.advantages`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from prl.numerics import advantages as adv
from prl.numerics import kl as klmod
from prl.shards.gather import WORKERS, blocks, mask_column, mask_T
from prl.shards.options import ShardOptions
from prl.shards.spill import ScanSpill


@dataclass(frozen=True)
class Scores:
    """Per shipped sample, in final order (``_N``): reward after any KL penalty, advantage, group size; and the
    batch mean log ratio ``mean_d`` (with ``kl`` in ``reward`` / ``advantages``, else 0.0; only the token
    advantages of ``kl = "advantages"`` use it)."""

    reward_N: np.ndarray
    advantage_N: np.ndarray
    group_size_N: np.ndarray
    mean_d: float
    singleton_groups: int
    singletons_without_baseline: int

    def rows(self, rows: slice) -> Scores:
        """The scores of ``rows`` alone (the same ``mean_d`` and counts)."""
        return replace(
            self, reward_N=self.reward_N[rows], advantage_N=self.advantage_N[rows], group_size_N=self.group_size_N[rows]
        )


@dataclass(frozen=True)
class LogRatioTotals:
    """Per shipped sample (final order): ``Σ_t k(d_t)`` (only with ``kl = "reward"``), ``Σ_t d_t`` and the number
    of valid tokens (float64, float64, int64)."""

    kl_sum_N: np.ndarray | None
    d_sum_N: np.ndarray
    count_N: np.ndarray


def _spilled_sums(
    trace_spill: ScanSpill,
    ref_spill: ScanSpill,
    ship: pl.DataFrame,
    bounds: np.ndarray,
    options: ShardOptions,
    todo_N: np.ndarray | None = None,
) -> LogRatioTotals:
    """A pass over the spilled rows, shard by shard (:data:`~prl.shards.gather.WORKERS` threads). Only the samples
    marked in ``todo_N`` (all when None) are read; the others are left at 0. Every sum covers one sample alone, so
    nothing depends on the threads, the blocks or which other samples were read."""
    with_k = options.kl == "reward"
    n = ship.height
    rows_N, ref_rows_N = ship["row"].to_numpy(), ship["ref_row"].to_numpy()
    has_mask_N = ship["has_mask"].to_numpy()
    totals = LogRatioTotals(np.zeros(n) if with_k else None, np.zeros(n), np.zeros(n, dtype=np.int64))

    def one(s: int) -> None:
        pick = np.arange(int(bounds[s]), int(bounds[s + 1]))
        if todo_N is not None:
            pick = pick[todo_N[pick]]
        if not len(pick):
            return
        traces = trace_spill.flat(rows_N[pick], ["completion_logprobs", *mask_column(has_mask_N[pick])])
        refs = ref_spill.flat(ref_rows_N[pick], ["ref_logprobs"])
        lp_T, ref_T = traces["completion_logprobs"].filled(), refs["ref_logprobs"].filled()  # NaN for nulls
        off = traces["completion_logprobs"].offsets_N1
        m_T = mask_T(traces.get("completion_mask"), off)
        del traces, refs
        for r0, r1 in blocks(off):
            t0, t1 = int(off[r0]), int(off[r1])
            off_b = off[r0 : r1 + 1] - t0
            rows = pick[r0:r1]
            if totals.kl_sum_N is not None:
                _, k_B, valid_B = klmod.masked_kl(lp_T[t0:t1], ref_T[t0:t1], m_T[t0:t1], options.kl_estimator)
                totals.kl_sum_N[rows] = klmod.segment_sum(k_B, off_b)
            else:
                _, valid_B = klmod.masked_log_ratio(lp_T[t0:t1], ref_T[t0:t1], m_T[t0:t1])
            totals.d_sum_N[rows] = klmod.log_ratio_sums(lp_T[t0:t1], ref_T[t0:t1], valid_B, off_b)
            totals.count_N[rows] = klmod.valid_counts(valid_B, off_b)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        list(pool.map(one, range(len(bounds) - 1)))
    return totals


def log_ratio_totals(
    trace_spill: ScanSpill, ref_spill: ScanSpill, ship: pl.DataFrame, bounds: np.ndarray, options: ShardOptions
) -> LogRatioTotals:
    """Per-sample KL and log-ratio sums over the valid tokens of the shipped samples (final order; shard ``s`` is
    ``bounds[s]:bounds[s + 1]``). With ``kl = "advantages"``, samples the plan scans summed whole
    (``lp_simple & ref_simple``) take those sums and are not read again."""
    if options.kl != "advantages":
        return _spilled_sums(trace_spill, ref_spill, ship, bounds, options)
    simple_N = (ship["lp_simple"] & ship["ref_simple"]).fill_null(False).to_numpy()
    todo_N = None if not simple_N.any() else ~simple_N
    totals = _spilled_sums(trace_spill, ref_spill, ship, bounds, options, todo_N)
    return LogRatioTotals(
        None,
        np.where(simple_N, (ship["lp_sum"] - ship["ref_sum"]).to_numpy(), totals.d_sum_N),
        np.where(simple_N, ship["completion_len"].to_numpy(), totals.count_N),
    )


def compute_scores(ship: pl.DataFrame, options: ShardOptions, totals: LogRatioTotals | None = None) -> Scores:
    """Rewards (with KL into the reward: ``r − β·Σ_t k(d_t)``), the batch mean log ratio (with KL into the
    advantages) and group-relative advantages of the shipped samples ``ship`` (final order). ``totals`` is
    needed with ``kl`` in ``reward`` / ``advantages`` (a dry run passes None: no KL)."""
    reward_N = ship["score"].to_numpy().astype(np.float64)
    mean_d = 0.0
    if totals is not None and options.kl == "reward" and totals.kl_sum_N is not None:
        reward_N = klmod.kl_into_reward(reward_N, totals.kl_sum_N, options.kl_coef)
    if totals is not None:
        mean_d = klmod.batch_mean_log_ratio(totals.d_sum_N, totals.count_N)
    gidx, _ = adv.dense_index(ship["group_id"].to_arrow())
    fallback: np.ndarray | None
    if options.singleton_baseline == "batch":
        fallback = np.zeros(ship.height, dtype=np.int64)
    elif options.singleton_baseline == "none":
        fallback = None
    else:
        fallback, _ = adv.dense_index(ship["baseline_key"].to_arrow())
    result = adv.compute_advantages(reward_N, gidx, options.advantage, fallback)
    return Scores(
        reward_N,
        result.advantages_N,
        result.group_size_N,
        mean_d,
        result.singleton_groups,
        result.singletons_without_baseline if fallback is not None else result.singleton_groups,
    )


__all__ = ["LogRatioTotals", "Scores", "compute_scores", "log_ratio_totals"]
