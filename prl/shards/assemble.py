"""One shard's rows: the ``SHARD`` table (docs/design.md) of a run of shipped samples, from their gathered token
columns, their plan rows and the scores.

Per-token values are computed over cache-sized blocks of whole samples (:func:`prl.shards.gather.blocks`):
``loss_mask`` (the completion mask, all True without one, less every position whose behaviour or reference
logprob is null or not finite: no loss multiplies an undefined value), ``token_advantages`` (the sample's advantage on
``loss_mask`` tokens, 0 elsewhere, plus ``β·(mean_d − d_t)`` on valid tokens with ``kl = "advantages"``) and,
with KL, the per-token estimate ``kl`` (null outside the loss mask or where a logprob is missing). Top-k heads are
cut to the set's ``k`` (:func:`prl.numerics.heads.fixed_k`). Every value depends only on its own sample, so the
bytes do not depend on how samples are blocked or which thread assembles them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from prl.numerics import heads
from prl.numerics import kl as klmod
from prl.schema import SHARD
from prl.shards.gather import INPUT_IDS, blocks, list_array, mask_T
from prl.shards.options import ShardOptions
from prl.shards.scores import Scores
from prl.shards.spill import FlatList


@dataclass
class Gathered:
    """A shard's rows as gathered from the spills, in final order: ``traces`` holds :data:`INPUT_IDS`,
    ``completion_logprobs`` and (when a row has one) ``completion_mask``; ``nested`` the top-k heads (when the
    set has heads); ``ref`` the reference logprobs (with KL)."""

    traces: dict[object, FlatList]
    nested: pa.Table | None
    ref: FlatList | None


@dataclass
class _TokenValues:
    """Completion-aligned values of a shard (``_T``, bounded by ``c_off``)."""

    c_off: np.ndarray
    mask_T: np.ndarray
    adv32_T: np.ndarray
    kl32_T: np.ndarray | None
    valid_T: np.ndarray | None
    unsafe_tokens: int = 0
    unsafe_samples: int = 0


def safe_loss_mask(
    m_T: np.ndarray, lp_T: np.ndarray, ref_T: np.ndarray | None, off_R1: np.ndarray
) -> tuple[np.ndarray, int, int]:
    """``(loss mask, unsafe tokens, rows with one)``: a loss-mask position whose behaviour logprob (or, with KL,
    reference logprob) is null (NaN here) or not finite leaves the mask, so every value a loss multiplies there
    (token advantage, KL) is defined; ``token_advantages`` is then 0 and ``kl`` null at that position. Row ``r``
    holds positions ``off_R1[r]:off_R1[r + 1]`` (a shard's samples, or its merged rows)."""
    safe_T = np.isfinite(lp_T)
    if ref_T is not None:
        safe_T &= np.isfinite(ref_T)
    unsafe_T = m_T & ~safe_T
    if not unsafe_T.any():
        return m_T, 0, 0
    row_U = np.searchsorted(off_R1, np.flatnonzero(unsafe_T), side="right") - 1
    return m_T & safe_T, int(unsafe_T.sum()), len(np.unique(row_U))


def _token_values(rows: Gathered, advantage_N: np.ndarray, mean_d: float, options: ShardOptions) -> _TokenValues:
    """Loss mask, token advantages and (with KL) per-token KL and validity, block by block."""
    _, c_len = rows.traces[INPUT_IDS].part_lengths
    c_off = np.zeros(len(c_len) + 1, dtype=np.int64)
    np.cumsum(c_len, out=c_off[1:])
    m_T = mask_T(rows.traces.get("completion_mask"), c_off)
    lp_T = rows.traces["completion_logprobs"].filled()
    ref_T = rows.ref.filled() if rows.ref is not None else None
    m_T, unsafe_tokens, unsafe_samples = safe_loss_mask(m_T, lp_T, ref_T, c_off)
    masked = not m_T.all()
    into_adv = options.kl == "advantages"
    n_tokens = len(m_T)
    out = _TokenValues(c_off, m_T, np.empty(n_tokens, dtype=np.float32), None, None, unsafe_tokens, unsafe_samples)
    if ref_T is not None:
        out.kl32_T, out.valid_T = np.empty(n_tokens, dtype=np.float32), np.empty(n_tokens, dtype=bool)
    for r0, r1 in blocks(c_off):
        t0, t1 = int(c_off[r0]), int(c_off[r1])
        # float32 straight away unless the KL penalty is added in float64 first (the cast commutes with the
        # broadcast and with the 0/1 mask, so the stored values are the same either way)
        adv_B = klmod.broadcast(advantage_N[r0:r1].astype(np.float64 if into_adv else np.float32), c_off[r0 : r1 + 1])
        if masked:
            adv_B *= m_T[t0:t1]
        if out.kl32_T is not None and out.valid_T is not None and ref_T is not None:
            mask_B = m_T[t0:t1] if masked else None  # all True: nothing to combine
            d_B, k_B, out.valid_T[t0:t1] = klmod.masked_kl(lp_T[t0:t1], ref_T[t0:t1], mask_B, options.kl_estimator)
            out.kl32_T[t0:t1] = k_B
            if into_adv:  # into d's buffer: d is not needed afterwards
                adv_B = klmod.kl_into_token_advantages(adv_B, d_B, out.valid_T[t0:t1], options.kl_coef, mean_d, out=d_B)
        out.adv32_T[t0:t1] = adv_B
    return out


def _kl_columns(
    rows: Gathered, values: _TokenValues, n_rows: int, estimator: str
) -> tuple[pa.Array, pa.Array, float, int, int]:
    """``(ref_logprobs, kl, Σ kl, kl token count, tokens at the k3 cap)``: null columns and 0.0, 0, 0 without KL.
    The sum adds the float32 values stored, in float64; the last count is 0 for the other estimators."""
    if rows.ref is None or values.kl32_T is None or values.valid_T is None:
        nulls = pa.nulls(n_rows, SHARD.field("kl").type)
        return nulls, nulls, 0.0, 0, 0
    every = bool(values.valid_T.all())
    kl_col = list_array(values.kl32_T, values.c_off, pa.float32(), None if every else values.valid_T)
    kl_T = values.kl32_T if every else values.kl32_T[values.valid_T]
    capped = int(np.count_nonzero(kl_T >= klmod.K3_MAX)) if estimator == "k3" else 0
    kl_vals = pa.array(kl_T)
    return rows.ref.to_arrow(pa.float32()), kl_col, float(pc.sum(kl_vals).as_py() or 0.0), len(kl_vals), capped


def _head_columns(nested: pa.Table | None, k: int | None, n_rows: int) -> tuple[pa.Array, pa.Array]:
    """``(topk_ids, topk_logprobs)`` cut to ``k`` (null columns without heads)."""
    if k is None or nested is None:
        return pa.nulls(n_rows, SHARD.field("topk_ids").type), pa.nulls(n_rows, SHARD.field("topk_logprobs").type)
    return heads.fixed_k(nested["topk_ids"], k, heads.PAD_ID), heads.fixed_k(
        nested["topk_logprobs"], k, heads.PAD_LOGPROB
    )


@dataclass
class Assembled:
    """One shard's table, the sum (float64) and count of its per-token KL values (0.0, 0 without KL), and the
    loss-mask positions taken out because a logprob there was null or not finite (and the samples they are in);
    for merged rows, the tokens their turns hold one row each (``merge_turns``); with k3, the KL values at its
    cap (:data:`prl.numerics.kl.K3_MAX`)."""

    table: pa.Table
    kl_sum: float
    kl_tokens: int
    unsafe_tokens: int
    unsafe_samples: int
    unmerged_tokens: int = 0
    kl_capped: int = 0


def _sampling_columns(meta: pl.DataFrame) -> dict[str, pa.Array]:
    """Per-row sampling settings and policy version as a step, from the plan rows (nulls where unknown)."""
    out: dict[str, pa.Array] = {}
    for name in ("temperature", "top_p", "top_k", "logprobs_mode", "policy_step", "policy_version_spans"):
        if name in meta.columns:
            out[name] = meta[name].to_arrow()
        else:
            out[name] = pa.nulls(meta.height, SHARD.field(name).type)
    return out


def assemble_shard(
    rows: Gathered, meta: pl.DataFrame, scores: Scores, options: ShardOptions, k: int | None
) -> Assembled:
    """One shard's Arrow table in ``SHARD`` schema and what was counted assembling it (:class:`Assembled`).
    ``rows`` are the shard's rows, ``meta`` their plan values and ``scores`` theirs, row for row; ``k`` is the
    set's head width (None without heads)."""
    ids = rows.traces[INPUT_IDS]
    p_len, _ = ids.part_lengths
    values = _token_values(rows, scores.advantage_N, scores.mean_d, options)
    ref_col, kl_col, kl_tok_sum, kl_tok_n, capped = _kl_columns(rows, values, meta.height, options.kl_estimator)
    topk_ids, topk_lps = _head_columns(rows.nested, k, meta.height)
    columns = {
        "sample_id": meta["sample_id"].to_arrow(),
        "group_id": meta["group_id"].to_arrow(),
        "policy_version": meta["policy_version"].to_arrow(),
        "staleness": meta["staleness"].to_arrow(),
        "input_ids": ids.to_arrow(pa.int32()),
        "prompt_len": pa.array(p_len.astype(np.int32)),
        "loss_mask": list_array(values.mask_T, values.c_off, pa.bool_()),
        "behavior_logprobs": rows.traces["completion_logprobs"].to_arrow(pa.float32()),
        "ref_logprobs": ref_col,
        "kl": kl_col,
        "token_advantages": list_array(values.adv32_T, values.c_off, pa.float32()),
        "reward": pa.array(scores.reward_N),
        "advantage": pa.array(scores.advantage_N),
        "group_size": pa.array(scores.group_size_N),
        "topk_ids": topk_ids,
        "topk_logprobs": topk_lps,
        **_sampling_columns(meta),
    }
    arrays = []
    for f in SHARD:
        col = columns[f.name]
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks else pa.array([], f.type)
        arrays.append(col.cast(f.type) if col.type != f.type else col)
    table = pa.Table.from_arrays(arrays, schema=SHARD)
    return Assembled(table, kl_tok_sum, kl_tok_n, values.unsafe_tokens, values.unsafe_samples, kl_capped=capped)


__all__ = ["Assembled", "Gathered", "assemble_shard"]
