"""One shard's merged rows in ``SHARD`` schema, from the turns of its units (``[shards] merge_turns = true``).

The build's plan decides which turns ship as one row (:func:`prl.shards.merge.plan_units`) and scores each unit;
this module lays the turns' token columns on the merged rows (:func:`prl.shards.merge.merge_turns`, then one take
per column) and computes what is per token:

- ``loss_mask``: a turn's own ``completion_mask`` (true where absent) on its sampled tokens, false on every token
  between completions, less every position whose behaviour logprob (or, with KL, reference logprob) is null or
  not finite (the safe-values rule of unmerged rows: no loss multiplies an undefined value; counted);
- ``behavior_logprobs``, ``ref_logprobs``: the turns' values on sampled tokens, null in between;
- ``topk_*``: the turns' heads cut or padded to ``k`` (``prl.numerics.heads.fixed_k``), so positions between
  completions hold padding (id -1, logprob -inf) like any position narrower than ``k``;
- ``kl``: the estimator on each sampled token inside the loss mask (``d = log q − log p_ref``), null elsewhere;
- ``token_advantages``: the row's advantage on loss-mask tokens (plus ``β·(mean_d − d_t)`` with KL into the
  advantages), 0.0 elsewhere.

Per row: ``sample_id`` and ``group_id`` are the first turn's; policy version, spans and sampling settings follow
:mod:`prl.shards.merge_sampling` (a change of sampling settings starts a new row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from prl.numerics import heads
from prl.numerics import kl as klmod
from prl.schema import SHARD
from prl.shards.assemble import safe_loss_mask
from prl.shards.merge import MergedRows, gather_column, merge_turns
from prl.shards.merge_sampling import SAMPLING_SETTINGS, merged_spans, oldest_turn, settings_change


@dataclass(frozen=True)
class UnitScores:
    """Per unit (in the order units first appear among the turns): ``reward_U``, ``advantage_U`` (float64) and
    ``group_size_U`` (int32); ``mean_d``: the batch's mean log ratio (KL into the advantages)."""

    reward_U: np.ndarray
    advantage_U: np.ndarray
    group_size_U: np.ndarray
    mean_d: float = 0.0


@dataclass(frozen=True)
class KlSettings:
    """Where KL goes (``none``, ``column``, ``reward``, ``advantages``), its coefficient and estimator."""

    mode: str = "none"
    coef: float = 0.0
    estimator: str = "k3"


@dataclass(frozen=True)
class MergedShard:
    """A shard's merged rows: the ``SHARD`` table, how its turns were merged, and the loss-mask positions taken
    out because a logprob there was null or not finite (and the rows they are in)."""

    table: pa.Table
    rows: MergedRows
    unsafe_tokens: int = 0
    unsafe_rows: int = 0


def _flat(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    return values.to_numpy(zero_copy_only=False), offsets - offsets[0]


def _floats(column: pa.ListArray) -> np.ndarray:
    """A merged float list column's values as float64, NaN where null."""
    return column.values.to_numpy(zero_copy_only=False).astype(np.float64)


def _column(turns: pa.Table, name: str) -> pa.Array:
    """A turn column as one array (nulls of the shard's type when the turns lack it)."""
    if name not in turns.column_names:
        return pa.nulls(turns.num_rows, SHARD.field(name).type)
    col = turns[name]
    return col.combine_chunks() if col.num_chunks else pa.array([], col.type)


def merge_keys(turns: pa.Table, unit_N: np.ndarray) -> np.ndarray:
    """int64[N]: the key :func:`merge_turns` merges on: a new key at each unit's first turn and at each turn whose
    sampling settings differ from its predecessor's (:func:`prl.shards.merge_sampling.settings_change`)."""
    present = [c for c in SAMPLING_SETTINGS if c in turns.column_names]
    new_N = np.zeros(len(unit_N), dtype=bool)
    if present:
        settings = pl.from_arrow(turns.select(present))
        assert isinstance(settings, pl.DataFrame)
        new_N = settings_change(settings).to_numpy().astype(bool)
    if len(unit_N):
        new_N[0] = True
        new_N[1:] |= unit_N[1:] != unit_N[:-1]
    return np.cumsum(new_N).astype(np.int64)


def _per_row(turns: pa.Table, rows: MergedRows, c_off: np.ndarray) -> dict[str, pa.Array]:
    """The per-row columns taken from the turns: names (first turn), version and staleness (oldest turn), spans,
    sampling settings (shared by the row's turns)."""
    first = pa.array(rows.first_turn_R)
    staleness = _column(turns, "staleness").to_numpy(zero_copy_only=False).astype(np.float64)
    oldest = pa.array(oldest_turn(staleness, rows))
    version = _column(turns, "policy_version")
    out = {
        "sample_id": _column(turns, "sample_id").take(first),
        "group_id": _column(turns, "group_id").take(first),
        "policy_version": version.take(oldest),
        "policy_step": _column(turns, "policy_step").take(oldest),
        "staleness": _column(turns, "staleness").take(oldest),
        "policy_version_spans": merged_spans(version, _column(turns, "policy_version_spans"), c_off, rows),
    }
    for name in SAMPLING_SETTINGS:
        out[name] = _column(turns, name).take(first)
    return out


def assemble_merged(
    turns: pa.Table,
    unit_N: np.ndarray,
    scores: UnitScores,
    kl: KlSettings,
    k: int | None = None,
    window: int = 4,
) -> MergedShard:
    """The shard table of the merged rows of ``turns`` and how they were merged.

    ``turns``: one row per turn, units consecutive and in order, with ``sample_id``, ``group_id``,
    ``policy_version``, ``staleness``, ``prompt_token_ids``, ``completion_token_ids``, ``completion_logprobs``,
    ``completion_mask``, plus ``ref_logprobs`` (with KL) and ``topk_ids`` / ``topk_logprobs`` (with ``k``), and
    where known ``policy_step``, ``policy_version_spans`` and the sampling settings (null columns otherwise).
    ``unit_N``: each turn's unit (int64, consecutive). A unit whose turns' tokens do not extend each other, or
    whose sampling settings change, is split there (each part keeps the unit's scores)."""
    prompt_P, p_off = _flat(turns["prompt_token_ids"])
    completion_C, c_off = _flat(turns["completion_token_ids"])
    rows = merge_turns(prompt_P, p_off, completion_C, c_off, merge_keys(turns, unit_N), window)
    _, unit_of_turn = np.unique(unit_N, return_inverse=True)
    unit_R = unit_of_turn[rows.first_turn_R]
    region = pa.array(rows.region_off_R1, pa.int32())
    lp = gather_column(turns["completion_logprobs"], c_off, rows)
    own = gather_column(turns["completion_mask"], c_off, rows)
    mask_M = rows.sampled_M & own.values.fill_null(True).to_numpy(zero_copy_only=False)
    ref_col = kl_col = pa.nulls(rows.rows, SHARD.field("kl").type)
    ref_M = None
    if kl.mode != "none":
        ref_col = gather_column(turns["ref_logprobs"], c_off, rows)
        ref_M = _floats(ref_col)
    mask_M, unsafe_tokens, unsafe_rows = safe_loss_mask(mask_M, _floats(lp), ref_M, rows.region_off_R1)
    adv_M = np.repeat(scores.advantage_U[unit_R], np.diff(rows.region_off_R1)).astype(np.float64)
    adv_M[~mask_M] = 0.0
    if ref_M is not None:
        d_M, k_M, valid_M = klmod.masked_kl(_floats(lp), ref_M, mask_M, kl.estimator)
        kl_col = pa.ListArray.from_arrays(region, pa.array(k_M.astype(np.float32), mask=~valid_M))
        if kl.mode == "advantages":
            adv_M = klmod.kl_into_token_advantages(adv_M, d_M, valid_M, kl.coef, scores.mean_d)
    topk_ids = pa.nulls(rows.rows, SHARD.field("topk_ids").type)
    topk_lps = pa.nulls(rows.rows, SHARD.field("topk_logprobs").type)
    if k is not None:
        topk_ids = heads.fixed_k(gather_column(turns["topk_ids"], c_off, rows), k, heads.PAD_ID)
        topk_lps = heads.fixed_k(gather_column(turns["topk_logprobs"], c_off, rows), k, heads.PAD_LOGPROB)
    columns = {
        **_per_row(turns, rows, c_off),
        "input_ids": pa.ListArray.from_arrays(pa.array(rows.input_off_R1, pa.int32()), pa.array(rows.input_ids_T)),
        "prompt_len": pa.array(rows.prompt_len_R.astype(np.int32)),
        "loss_mask": pa.ListArray.from_arrays(region, pa.array(mask_M)),
        "behavior_logprobs": lp,
        "ref_logprobs": ref_col,
        "kl": kl_col,
        "token_advantages": pa.ListArray.from_arrays(region, pa.array(adv_M.astype(np.float32))),
        "reward": pa.array(scores.reward_U[unit_R].astype(np.float64)),
        "advantage": pa.array(scores.advantage_U[unit_R].astype(np.float64)),
        "group_size": pa.array(scores.group_size_U[unit_R].astype(np.int32)),
        "topk_ids": topk_ids,
        "topk_logprobs": topk_lps,
    }
    arrays = []
    for f in SHARD:
        col = columns[f.name]
        arrays.append(col.cast(f.type) if col.type != f.type else col)
    return MergedShard(pa.Table.from_arrays(arrays, schema=SHARD), rows, unsafe_tokens, unsafe_rows)


__all__ = ["KlSettings", "MergedShard", "UnitScores", "assemble_merged", "merge_keys"]
