"""What a merged row says about how its tokens were sampled: policy version, per-token version spans and sampling
settings (``[shards] merge_turns = true``).

A merged row holds the turns of one trajectory (one session, one agent), but the turns need not agree on how they
were sampled. The rules:

- **Sampling settings** (``temperature``, ``top_p``, ``top_k``, ``logprobs_mode``) are one value per row, so a
  turn whose settings differ from its predecessor's (null counts as a value) starts a new row
  (:func:`settings_change`, applied both when the plan groups turns and when a shard's rows are assembled); a row
  carries the settings its turns share.
- **policy_version / policy_step**: those of the row's oldest turn (the largest ``staleness``; the earliest such
  turn on a tie; the first turn when no staleness is known), so ``staleness = current − policy_step`` holds per
  row as it does per sample, and the row's staleness is its stalest token's (:func:`oldest_turn`).
- **policy_version_spans**: over the row's completion-aligned positions (everything after the first prompt, as
  every completion-aligned column), end exclusive: each sampled token's version, run-length encoded, from its
  turn's own spans where it has them, else its turn's ``policy_version`` (a null ``version`` where neither is
  known). Positions between completions (user, tool, observation tokens, REALIGN-overwritten spans) are not
  sampled and lie in no span. A row gets spans when one of its turns had spans or its turns' ``policy_version``
  differ; otherwise the column is null, as for an unmerged sample whose weights never changed
  (:func:`merged_spans`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from prl.schema import VERSION_SPAN

if TYPE_CHECKING:  # merge imports this module's settings rule
    from prl.shards.merge import MergedRows

SAMPLING_SETTINGS = ("temperature", "top_p", "top_k", "logprobs_mode")
"""Per-row sampling settings: a merged row's turns share them (a change starts a new row)."""

_UNSAMPLED = -1
_UNKNOWN = -2


def settings_change(turns: pl.DataFrame) -> pl.Series:
    """bool per turn (``turns`` in merge order): some sampling setting differs from the previous turn's (nulls
    compare as values; the first turn is False). Only the :data:`SAMPLING_SETTINGS` columns ``turns`` has are
    compared (none: never a change)."""
    names = [c for c in SAMPLING_SETTINGS if c in turns.columns]
    if not names or turns.height == 0:
        return pl.Series("settings_change", [False] * turns.height, dtype=pl.Boolean)
    changed = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in names])
    changed = changed & (pl.int_range(pl.len()) > 0)
    return turns.select(changed.fill_null(False).alias("settings_change")).to_series()


def oldest_turn(staleness_N: np.ndarray, rows: MergedRows) -> np.ndarray:
    """int64[R]: per row, the turn with the largest staleness (``staleness_N`` float64, NaN where unknown), the
    earliest such turn on a tie, the first turn when none is known."""
    if rows.rows == 0:
        return np.zeros(0, dtype=np.int64)
    turns = rows.turns_K
    s = staleness_N[turns]
    s = np.where(np.isnan(s), -np.inf, s)
    row_K = np.repeat(np.arange(rows.rows), np.diff(rows.turns_off_R1))
    order = np.lexsort((np.arange(len(turns)), -s, row_K))
    return turns[order[rows.turns_off_R1[:-1]]]


def _version_codes(
    version_N: pa.Array, spans_N: pa.Array, completion_off_N1: np.ndarray
) -> tuple[np.ndarray, pa.Array, np.ndarray, np.ndarray]:
    """``(code_C, vocabulary, has_spans_N, code_N)``: per completion token of the turns, an index into
    ``vocabulary`` (the version strings), :data:`_UNKNOWN` where no version is known; whether each turn had spans;
    each turn's own version as such an index."""
    spans_N = spans_N.cast(pa.list_(VERSION_SPAN))
    flat = pc.list_flatten(spans_N)
    span_turn = pc.list_parent_indices(spans_N).to_numpy(zero_copy_only=False).astype(np.int64)
    span_version = flat.field("version") if len(flat) else pa.array([], pa.string())
    encoded = pa.concat_arrays([version_N.cast(pa.string()), span_version.cast(pa.string())]).dictionary_encode()
    codes = encoded.indices.fill_null(_UNKNOWN).to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(version_N)
    code_C = np.repeat(codes[:n], np.diff(completion_off_N1))
    lengths = np.diff(completion_off_N1)[span_turn] if len(span_turn) else np.zeros(0, np.int64)
    starts = flat.field("start").to_numpy(zero_copy_only=False) if len(flat) else np.zeros(0)
    ends = flat.field("end").to_numpy(zero_copy_only=False) if len(flat) else np.zeros(0)
    for j in range(len(span_turn)):  # one slice per span, never per token
        lo, hi = max(int(starts[j]), 0), min(int(ends[j]), int(lengths[j]))
        if hi > lo:
            base = int(completion_off_N1[span_turn[j]])
            code_C[base + lo : base + hi] = codes[n + j]
    has_spans_N = (pc.list_value_length(spans_N).fill_null(0).to_numpy(zero_copy_only=False) > 0).astype(bool)
    return code_C, encoded.dictionary, has_spans_N, codes[:n]


def merged_spans(
    version_N: pa.Array, spans_N: pa.Array, completion_off_N1: np.ndarray, rows: MergedRows
) -> pa.ListArray:
    """The rows' ``policy_version_spans`` (see the module docstring). ``version_N`` / ``spans_N``: the turns'
    ``policy_version`` and ``policy_version_spans`` (spans over completion positions, end exclusive);
    ``completion_off_N1``: the turns' completion offsets the gather map indexes."""
    code_C, vocabulary, has_spans_N, code_N = _version_codes(version_N, spans_N, completion_off_N1)
    sampled = rows.sampled_M
    code_M = np.full(len(sampled), _UNSAMPLED, dtype=np.int64)
    code_M[sampled] = code_C[rows.source_M[sampled]]
    region = rows.region_off_R1
    row_start = np.zeros(len(code_M), dtype=bool)
    row_start[region[:-1][np.diff(region) > 0]] = True
    boundary = row_start.copy()
    boundary[1:] |= code_M[1:] != code_M[:-1]
    run_start = np.flatnonzero(boundary)
    run_end = np.append(run_start[1:], len(code_M))
    run_code = code_M[run_start]
    run_row = np.searchsorted(region, run_start, side="right") - 1
    keep = run_code != _UNSAMPLED
    run_start, run_end, run_code, run_row = run_start[keep], run_end[keep], run_code[keep], run_row[keep]
    need_R = np.zeros(rows.rows, dtype=bool)
    if rows.rows:
        turn_code, starts = code_N[rows.turns_K], rows.turns_off_R1[:-1]
        need_R = np.minimum.reduceat(turn_code, starts) != np.maximum.reduceat(turn_code, starts)
        need_R |= np.logical_or.reduceat(has_spans_N[rows.turns_K], starts)
    take = need_R[run_row]
    run_start, run_end, run_code, run_row = run_start[take], run_end[take], run_code[take], run_row[take]
    known = run_code >= 0
    version = pc.take(vocabulary, pa.array(np.where(known, run_code, 0), pa.int64(), mask=~known))
    base = region[run_row]
    structs = pa.StructArray.from_arrays(
        [version, pa.array((run_start - base).astype(np.int32)), pa.array((run_end - base).astype(np.int32))],
        fields=list(VERSION_SPAN),
    )
    offsets = np.zeros(rows.rows + 1, dtype=np.int32)
    np.cumsum(np.bincount(run_row, minlength=rows.rows), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), structs, mask=pa.array(~need_R))


__all__ = ["SAMPLING_SETTINGS", "merged_spans", "oldest_turn", "settings_change"]
