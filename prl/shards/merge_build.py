"""Merged multi-turn rows inside a build (``[shards] merge_turns = true``): what the plan, the scores and the
assembly do differently.

- Plan: the kept turns are grouped into units (:func:`prl.shards.merge.plan_units`, from ``check-tokens``' prefix
  status and the trajectory order); every turn of a unit takes the unit's ``group_id`` (its first turn's) and its
  combined ``score``, and carries ``unit_first`` / ``unit_pos`` so that packing keeps a unit's turns together and in
  order, and ``row_tokens`` so that shards are filled by the tokens of merged rows (:func:`mark_units`). A change
  of sampling settings starts a unit (:mod:`prl.shards.merge_sampling`).
- Scores: advantages are computed over units (one row each, its first turn), not over turns, so a long trajectory
  does not weigh more in its group's baseline (:func:`unit_scores`); with ``kl = "reward"`` a unit's penalty is the
  sum over its turns.
- Assembly: a shard's turns are merged and laid out by :func:`prl.shards.merge_assemble.assemble_merged`
  (:func:`assemble_merged_shard`), with the per-row version, spans and sampling settings of
  :mod:`prl.shards.merge_sampling`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from prl.numerics.kl import K3_MAX
from prl.shards.assemble import Gathered
from prl.shards.gather import INPUT_IDS
from prl.shards.manifest import FileEntry
from prl.shards.merge import plan_units
from prl.shards.merge_assemble import KlSettings, MergedShard, UnitScores, assemble_merged
from prl.shards.merge_sampling import SAMPLING_SETTINGS
from prl.shards.options import ShardOptions
from prl.shards.scores import LogRatioTotals, Scores, compute_scores

TURN_SCALARS = (
    "sample_id",
    "group_id",
    "policy_version",
    "policy_step",
    "policy_version_spans",
    "staleness",
    *SAMPLING_SETTINGS,
)
"""The plan columns a shard's turns bring to their merged rows (:mod:`prl.shards.merge_sampling`)."""


def mark_units(plan: pl.DataFrame, keep: pl.DataFrame, options: ShardOptions) -> pl.DataFrame:
    """``keep`` (the kept turns) with ``unit`` (int64), ``unit_first`` (the unit's first sample_id), ``unit_pos``
    (0-based place in the unit), ``row_tokens`` (the tokens the turn's merged row will hold, on its last turn; 0
    on the others: what packing counts), and ``group_id`` / ``score`` replaced by the unit's. ``plan``: every turn
    considered, with ``drop`` (null when kept) and ``prefix_status``."""
    kept = pl.col("row").is_in(keep.get_column("row").implode())
    units = plan_units(plan.with_columns(kept.alias("kept")), options.merge_reward)
    members = (
        units.select(
            "unit",
            pl.col("sample_id").alias("unit_first"),
            pl.col("group_id").alias("_unit_group"),
            pl.col("score").alias("_unit_score"),
            "turn_rows",
        )
        .with_columns(pl.int_ranges(pl.col("turn_rows").list.len()).alias("unit_pos"))
        .explode(["turn_rows", "unit_pos"])
        .rename({"turn_rows": "row"})
    )
    out = keep.join(members, on="row", how="inner")
    last = pl.col("unit_pos") == pl.col("unit_pos").max().over("unit")
    return out.with_columns(
        pl.col("_unit_group").alias("group_id"),
        pl.col("_unit_score").alias("score"),
        pl.col("unit_pos").cast(pl.Int64),
        pl.when(last).then(pl.col("prompt_len") + pl.col("completion_len")).otherwise(0).alias("row_tokens"),
    ).drop("_unit_group", "_unit_score")


def unit_index(ship: pl.DataFrame) -> np.ndarray:
    """int64[N]: each shipped turn's unit number in the final order (units are consecutive runs)."""
    return np.cumsum(ship.get_column("unit_pos").to_numpy() == 0) - 1


def planned_merged(ship: pl.DataFrame) -> tuple[int, int]:
    """(rows, tokens) the planned units make: a unit's row is its last turn's prompt + completion (CLEAN and
    REALIGN turns extend the one before)."""
    last = ship.filter(pl.col("unit_pos").shift(-1).fill_null(0) == 0)
    return last.height, int((last["prompt_len"] + last["completion_len"]).sum())


def unit_scores(ship: pl.DataFrame, options: ShardOptions, totals: LogRatioTotals | None) -> Scores:
    """Scores per unit (final order of units): the first turn of each unit stands for it; with KL totals, a unit's
    sums are the sums over its turns (the batch mean log ratio is the same either way)."""
    starts = np.flatnonzero(ship.get_column("unit_pos").to_numpy() == 0)
    firsts = ship[starts]
    if totals is not None and len(starts):

        def per_unit(values: np.ndarray) -> np.ndarray:
            return np.add.reduceat(values, starts)

        totals = replace(
            totals,
            kl_sum_N=None if totals.kl_sum_N is None else per_unit(totals.kl_sum_N),
            d_sum_N=per_unit(totals.d_sum_N),
            count_N=per_unit(totals.count_N),
        )
    return compute_scores(firsts, options, totals)


def _split(ids: np.ndarray, offsets: np.ndarray, prompt_len: np.ndarray) -> tuple[pa.ListArray, pa.ListArray]:
    """Prompt and completion list arrays of row-wise concatenated ``prompt + completion`` values."""
    row = np.repeat(np.arange(len(prompt_len)), np.diff(offsets))
    in_prompt = (np.arange(len(ids)) - offsets[:-1][row]) < prompt_len[row]
    c_len = np.diff(offsets) - prompt_len

    def lists(values: np.ndarray, lengths: np.ndarray) -> pa.ListArray:
        off = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=off[1:])
        return pa.ListArray.from_arrays(pa.array(off), pa.array(values, pa.int32()))

    return lists(ids[in_prompt], prompt_len), lists(ids[~in_prompt], c_len)


def assemble_merged_shard(
    rows: Gathered,
    meta: pl.DataFrame,
    unit_N: np.ndarray,
    scores: Scores,
    options: ShardOptions,
    k: int | None,
    window: int = 4,
) -> MergedShard:
    """One shard's merged rows in ``SHARD`` schema. ``rows`` / ``meta``: the shard's shipped turns (final order) as
    gathered and planned; ``unit_N``: their unit numbers (:func:`unit_index`); ``scores``: per unit
    (:func:`unit_scores`)."""
    ids = rows.traces[INPUT_IDS]
    p_len, _ = ids.part_lengths
    prompt, completion = _split(ids.values_T, ids.offsets_N1, p_len.astype(np.int64))
    columns = {
        **{c: meta[c].to_arrow() for c in TURN_SCALARS if c in meta.columns},
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_logprobs": rows.traces["completion_logprobs"].to_arrow(pa.float32()),
        "completion_mask": _mask(rows, meta.height),
    }
    if rows.ref is not None:
        columns["ref_logprobs"] = rows.ref.to_arrow(pa.float32())
    if rows.nested is not None:
        columns["topk_ids"] = rows.nested["topk_ids"]
        columns["topk_logprobs"] = rows.nested["topk_logprobs"]
    # the part's own scores, its units numbered from 0 (prl.shards.shiprows.part_scores)
    shard_scores = UnitScores(scores.reward_N, scores.advantage_N, scores.group_size_N, scores.mean_d)
    kl = KlSettings(options.kl, options.kl_coef, options.kl_estimator)
    return assemble_merged(pa.table(columns), unit_N, shard_scores, kl, k, window)


def _mask(rows: Gathered, n: int) -> pa.Array:
    """The turns' ``completion_mask`` column (null rows where a turn has none)."""
    mask = rows.traces.get("completion_mask")
    return mask.to_arrow(pa.bool_()) if mask is not None else pa.nulls(n, pa.list_(pa.bool_()))


def kl_totals(shard: pa.Table, estimator: str = "k3") -> tuple[float, int, int]:
    """(Σ, count, count at the k3 cap) of a shard's per-token KL values (the float32 values stored, summed in
    float64); the last is 0 for the other estimators."""
    values = pc.list_flatten(shard["kl"]).drop_null()
    capped = int(pc.sum(pc.greater_equal(values, K3_MAX)).as_py() or 0) if estimator == "k3" and len(values) else 0
    return float(pc.sum(values.cast(pa.float64())).as_py() or 0.0), len(values), capped


def merged_statistics(turns: int, entries: list[FileEntry], unmerged_tokens: int) -> dict[str, float | int]:
    """The manifest's ``statistics.merged_turns``: turns shipped, rows they became, tokens shipped merged and what
    the same turns take one row each, and the fraction of tokens merging saves the trainer."""
    rows = sum(e.rows for e in entries)
    tokens = sum(e.tokens or 0 for e in entries)
    return {
        "turns": turns,
        "rows": rows,
        "tokens": tokens,
        "tokens_unmerged": unmerged_tokens,
        "saving": 1.0 - tokens / unmerged_tokens if unmerged_tokens else 0.0,
    }
