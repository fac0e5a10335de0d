"""``heads`` check: the sampler's top-k head per completion token (when ``topk_ids`` is present).

Reasons (all ``invalid``; completion positions):

- ``heads_shape``: head rows ≠ completion length, or ``topk_logprobs`` shaped unlike ``topk_ids``.
- ``heads_k_varies``: k differs between positions of one sample (the rest is then skipped).
- ``heads_id_range`` / ``heads_id_duplicate``: an ID outside the vocabulary, or twice in one head.
- ``heads_nonfinite``: a null, NaN or +inf head logprob.
- ``heads_not_sorted``: logprobs not descending; ``heads_positive``: a logprob > 0;
  ``heads_mass``: Σ exp(head logprobs) > 1 + ``head_mass_atol`` (full-vocabulary mass is never > 1).
- ``heads_misaligned``: the sampled token is in the head with a different logprob (atol ``head_atol``), or is
  missing from the head although its logprob beats the head's smallest one: heads and tokens are shifted.
- ``heads_degenerate``: a head of IDs 0..k−1 with uniform −log V logprobs (a filler, not a distribution).

``heads_ok`` in the verdict row is False when any of these holds, True when checked clean, null without heads.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prl.checks.arrays import Ragged, first_per_row, ragged
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.options import CheckOptions


def _positions(column: pa.Array) -> tuple[np.ndarray, Ragged]:
    """(positions per row int64[R], the flattened list<T> column as Ragged over positions)."""
    per_row = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return per_row, ragged(pc.list_flatten(column), np.float64, fill=np.nan)


def check_heads(batch: TokenBatch, vocab_size: int, opts: CheckOptions) -> tuple[Findings, np.ndarray]:
    """Findings, and heads_checked bool[R] (rows that carry heads)."""
    out = Findings()
    rec = batch.record
    ids_col, lp_col = rec.column("topk_ids"), rec.column("topk_logprobs")
    present_R = ids_col.is_valid().to_numpy(zero_copy_only=False)
    if not present_R.any():
        return out, present_R
    P_ids, head_ids = _positions(ids_col)
    P_lp, head_lp = _positions(lp_col)
    n_R = batch.completion.lengths
    lp_present_R = lp_col.is_valid().to_numpy(zero_copy_only=False)
    # position-level shapes: k per position from both columns must agree
    shape_bad_R = present_R & ((P_ids != n_R) | ~lp_present_R | (P_lp != P_ids))
    row_of_pos = np.repeat(np.arange(batch.rows), P_ids)
    k_ids = head_ids.lengths
    if not shape_bad_R.all():
        same_pos = ~shape_bad_R[row_of_pos]
        k_lp = np.zeros_like(k_ids)
        rows_lp = np.repeat(np.arange(batch.rows), P_lp)
        k_lp_valid = head_lp.lengths[~shape_bad_R[rows_lp]]
        k_lp[same_pos] = k_lp_valid
        inner_bad_P = same_pos & (k_lp != k_ids)
        shape_bad_R |= np.bincount(row_of_pos[inner_bad_P], minlength=batch.rows) > 0
    out.add(shape_bad_R, "heads_shape")

    # k constant within a row
    pos_rag = Ragged(k_ids, np.concatenate(([0], np.cumsum(P_ids))), present_R)
    kmin = np.full(batch.rows, np.iinfo(np.int64).max)
    kmax = np.full(batch.rows, -1)
    np.minimum.at(kmin, row_of_pos, k_ids)
    np.maximum.at(kmax, row_of_pos, k_ids)
    varies_R = present_R & ~shape_bad_R & (kmax > kmin) & (kmax >= 0)
    k_first = np.zeros(batch.rows, dtype=np.int64)
    if len(k_ids):
        k_first = np.where(P_ids > 0, k_ids[np.minimum(pos_rag.offsets[:-1], len(k_ids) - 1)], 0)
    first = first_per_row(k_ids != k_first[row_of_pos], pos_rag)
    out.add(varies_R, "heads_k_varies", first)

    good_R = present_R & ~shape_bad_R & ~varies_R & (P_ids > 0) & (kmin > 0)
    for k in np.unique(kmin[good_R]).tolist():
        _check_fixed_k(batch, k, good_R & (kmin == k), row_of_pos, head_ids, head_lp, pos_rag, vocab_size, opts, out)
    return out, present_R


def _check_fixed_k(
    batch: TokenBatch,
    k: int,
    rows_R: np.ndarray,
    row_of_pos: np.ndarray,
    head_ids: Ragged,
    head_lp: Ragged,
    pos_rag: Ragged,
    vocab_size: int,
    opts: CheckOptions,
    out: Findings,
) -> None:
    """Checks on the rows whose heads all have ``k`` entries: heads as [P, k] matrices."""
    sel_P = rows_R[row_of_pos]
    sel_T = np.repeat(sel_P, head_ids.lengths)
    ids_PK = head_ids.values[sel_T].astype(np.int64).reshape(-1, k)
    lp_PK = head_lp.values[sel_T].reshape(-1, k)
    lp_nulls = head_lp.nulls[sel_T].reshape(-1, k) if head_lp.nulls is not None else np.zeros_like(ids_PK, bool)
    rows_P = row_of_pos[sel_P]
    sub = Ragged(np.zeros(len(rows_P)), _offsets_for(rows_P, batch.rows), rows_R)

    def report(bad_P: np.ndarray, reason: str) -> None:
        first = first_per_row(bad_P, sub)
        out.add(first >= 0, reason, first)

    report(((ids_PK < 0) | (ids_PK >= vocab_size)).any(axis=1), "heads_id_range")
    sorted_ids = np.sort(ids_PK, axis=1)
    report((sorted_ids[:, 1:] == sorted_ids[:, :-1]).any(axis=1), "heads_id_duplicate")
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # a head of -inf only: its mass is -inf
        nonfinite = lp_nulls | np.isnan(lp_PK) | (lp_PK == np.inf)
        report(nonfinite.any(axis=1), "heads_nonfinite")
        finite_lp = np.where(nonfinite, -np.inf, lp_PK)
        report((np.diff(finite_lp, axis=1) > opts.head_atol).any(axis=1), "heads_not_sorted")  # type: ignore[arg-type]
        report((finite_lp > opts.positive_atol).any(axis=1), "heads_positive")  # type: ignore[arg-type]
        top = finite_lp.max(axis=1, keepdims=True)
        top_safe = np.where(np.isfinite(top), top, 0.0)
        mass = np.log(np.exp(finite_lp - top_safe).sum(axis=1)) + top_safe[:, 0]
        report(mass > math.log1p(opts.head_mass_atol), "heads_mass")

        # alignment with the sampled token (rows whose logprob count matches their completion)
        comp_sel = rows_R[batch.completion.row_of]
        sampled = batch.completion.values[comp_sel]
        lp_ok_R = batch.logprobs.lengths == batch.completion.lengths
        sampled_lp = np.full(len(sampled), np.nan)
        lp_sel = (rows_R & lp_ok_R)[batch.logprobs.row_of]
        sampled_lp[lp_ok_R[batch.completion.row_of][comp_sel]] = batch.logprobs.values[lp_sel]
        if batch.logprobs.nulls is not None:
            nul = np.zeros(len(sampled), bool)
            nul[lp_ok_R[batch.completion.row_of][comp_sel]] = batch.logprobs.nulls[lp_sel]
            sampled_lp[nul] = np.nan
        in_head = ids_PK == sampled[:, None]
        has = in_head.any(axis=1)
        head_lp_of_sampled = np.where(in_head, finite_lp, -np.inf).max(axis=1)
        known = np.isfinite(sampled_lp)
        mismatch = has & known & ~(np.abs(head_lp_of_sampled - sampled_lp) <= opts.head_atol)
        beats = ~has & known & (sampled_lp > finite_lp.min(axis=1) + opts.head_atol)
        report(mismatch | beats, "heads_misaligned")

        uniform = -math.log(vocab_size)
        degenerate = (ids_PK == np.arange(k)[None, :]).all(axis=1) & (
            np.abs(lp_PK - uniform) <= opts.degenerate_atol
        ).all(axis=1)
        report(degenerate, "heads_degenerate")


def _offsets_for(rows_P: np.ndarray, n_rows: int) -> np.ndarray:
    counts = np.bincount(rows_P, minlength=n_rows)
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
