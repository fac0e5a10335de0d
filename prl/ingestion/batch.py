"""Columnar validation and assembly of one batch of parsed samples into a ``traces`` record batch.

Each token column is built by one concatenation of the samples' arrays; validation (lengths, ID ranges,
finite and non-positive logprobs, top-k shapes) runs as numpy operations over the concatenated values with
per-row reductions over the offsets; the vLLM ``-9999.0`` floor becomes null in one pass. Only a row that fails
goes through :func:`prl.ingestion.assemble.validate`, which explains it (reason code and message); the only
per-row work otherwise is reading the scalar fields and hashing the row's bytes for ``record_digest``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prl.formats.base import Quarantined
from prl.ingestion.assemble import FLOAT32_MAX, INT32_MAX, VLLM_LOGPROB_FLOOR, Located, sample_id_of, validate
from prl.numerics.ragged import any_per_row
from prl.schema import TIMESTAMP_MS, TIMESTAMP_US, TRACES, VERSION_SPAN

TOPK_IDS = pa.list_(pa.int32())
TOPK_LOGPROBS = pa.list_(pa.float32())


@dataclass
class Checked:
    """A validated batch: ``batch`` holds the good rows (``rows[i]`` is the input index of batch row ``i``),
    ``rejected`` the input index and reason of every bad one."""

    batch: pa.RecordBatch
    rows: np.ndarray
    rejected: list[tuple[int, Quarantined]] = field(default_factory=list)


@dataclass
class _Flat:
    """Per-row arrays concatenated: ``offsets`` int64[N+1], ``values`` one Arrow array, ``null`` bool[N] for
    rows that had no array at all."""

    offsets: np.ndarray
    values: pa.Array
    null: np.ndarray | None

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def _flatten(rows: Sequence[Located], name: str, wide: pa.DataType) -> _Flat:
    """Column ``name`` of every row concatenated."""
    arrays = [getattr(r.sample, name) for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(
        np.fromiter((0 if a is None else len(a) for a in arrays), dtype=np.int64, count=len(arrays)), out=offsets[1:]
    )
    null_rows = np.fromiter((a is None for a in arrays), dtype=bool, count=len(arrays))
    null = null_rows if null_rows.any() else None
    present = [a for a in arrays if a is not None]
    if not present:
        return _Flat(offsets, pa.array([], wide), null)
    if any(a.type != present[0].type for a in present):
        present = [a.cast(wide) for a in present]  # mixed widths from different readers: the slow path
    return _Flat(offsets, pa.concat_arrays(present), null)


def _numpy(values: pa.Array, fill: float | int) -> np.ndarray:
    if values.null_count:
        values = pc.fill_null(values, fill)
    return values.to_numpy(zero_copy_only=False)


def _ids_out_of_range(values: np.ndarray) -> np.ndarray:
    return (values < 0) | (values > INT32_MAX)


def _floored(values: pa.Array) -> pa.Array:
    """Logprobs with the vLLM floor as null (float32)."""
    floor = pc.equal(values, VLLM_LOGPROB_FLOOR)  # the floor exactly: -10000.0 is a value, kept as sampled
    if values.null_count == 0 and not pc.any(floor).as_py():
        return values.cast(pa.float32())
    return pc.if_else(floor, pa.scalar(None, values.type), values).cast(pa.float32())


def _list(flat: _Flat, values: pa.Array) -> pa.Array:
    mask = None if flat.null is None else pa.array(flat.null)
    return pa.ListArray.from_arrays(pa.array(flat.offsets.astype(np.int32)), values, mask=mask)


def _suspects(rows: Sequence[Located], flats: dict[str, _Flat]) -> np.ndarray:
    """bool[N]: rows some check rejects (the scalar validator then names the reason)."""
    samples = [r.sample for r in rows]
    n = len(samples)
    prompt, comp, lp = flats["prompt"], flats["completion"], flats["logprobs"]
    clen = comp.lengths
    bad = np.fromiter((s.finish_reason is None for s in samples), dtype=bool, count=n)
    bad |= (prompt.lengths == 0) | (clen == 0) | (lp.lengths != clen)
    bad |= any_per_row(_ids_out_of_range(_numpy(prompt.values, 0)), prompt.offsets)
    bad |= any_per_row(_ids_out_of_range(_numpy(comp.values, 0)), comp.offsets)
    lp_values = _numpy(lp.values, -1.0)
    bad |= any_per_row(~np.isfinite(lp_values) | (lp_values > 0) | (lp_values < -FLOAT32_MAX), lp.offsets)
    mask = flats["mask"]
    if mask.null is None or not mask.null.all():
        bad |= (mask.null is None or ~mask.null) & (mask.lengths != clen)
    ids, lps = flats["topk_ids"], flats["topk_logprobs"]
    ids_null = np.zeros(n, bool) if ids.null is None else ids.null
    lps_null = np.zeros(n, bool) if lps.null is None else lps.null
    bad |= ids_null != lps_null
    heads = ~ids_null & ~lps_null
    if heads.any():
        bad |= heads & ((ids.lengths != clen) | (lps.lengths != clen))
        id_rows = pc.list_value_length(ids.values).to_numpy(zero_copy_only=False)
        lp_rows = pc.list_value_length(lps.values).to_numpy(zero_copy_only=False)
        if len(id_rows) == len(lp_rows):
            bad |= any_per_row(id_rows != lp_rows, ids.offsets)
            inner = pc.list_flatten(ids.values)
            per_position = any_per_row(_ids_out_of_range(_numpy(inner, 0)), _inner_offsets(ids.values))
            head_lps = _numpy(pc.list_flatten(lps.values), 0.0)
            per_position |= any_per_row(
                np.isfinite(head_lps) & (np.abs(head_lps) > FLOAT32_MAX), _inner_offsets(lps.values)
            )
            bad |= any_per_row(per_position, ids.offsets)
        else:
            bad |= heads
    return bad


def _inner_offsets(lists: pa.Array) -> np.ndarray:
    """int64[P+1] value offsets of a (possibly sliced) list array, starting at 0."""
    offsets = lists.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    return offsets - offsets[0]


def _head_column(flat: _Flat, inner_type: pa.DataType, logprobs: bool) -> pa.Array:
    """``[completion_len][k]`` top-k column: the outer lists over the concatenated per-position lists."""
    if flat.null is not None and flat.null.all():
        return pa.nulls(len(flat.offsets) - 1, pa.list_(pa.list_(inner_type)))
    positions = flat.values
    values = pc.list_flatten(positions)
    values = _floored(values) if logprobs else values.cast(pa.int32(), safe=False)
    inner = pa.ListArray.from_arrays(pa.array(_inner_offsets(positions).astype(np.int32)), values)
    return _list(flat, inner)


def _digests(flats: dict[str, _Flat], lp32: np.ndarray, keep: np.ndarray) -> tuple[list[str], list[str]]:
    """``record_digest`` (as :func:`prl.ingestion.assemble.record_digest`) and the prompt digest of the rows
    in ``keep``."""
    prompt, comp = flats["prompt"], flats["completion"]
    p32 = _numpy(prompt.values, 0).astype(np.int32, copy=False).data
    c32 = _numpy(comp.values, 0).astype(np.int32, copy=False).data
    lps = lp32.data
    po, co, lo = prompt.offsets.tolist(), comp.offsets.tolist(), flats["logprobs"].offsets.tolist()
    records, prompts = [], []
    for i in keep.tolist():
        prompt_bytes = p32[po[i] : po[i + 1]]
        h = hashlib.sha256(prompt_bytes)
        prompts.append(h.hexdigest()[:32])  # the digest so far: h goes on with the completion
        h.update(b"|")
        h.update(c32[co[i] : co[i + 1]])
        h.update(b"|")
        h.update(lps[lo[i] : lo[i + 1]])
        records.append(h.hexdigest())
    return records, prompts


def check_and_assemble(rows: Sequence[Located], ingested_at_ms: int) -> Checked:
    """Validate parsed samples and build the ``traces`` batch of the good ones (with their ``record_digest``)."""
    samples = [r.sample for r in rows]
    flats = {
        "prompt": _flatten(rows, "prompt_token_ids", pa.int64()),
        "completion": _flatten(rows, "completion_token_ids", pa.int64()),
        "logprobs": _flatten(rows, "completion_logprobs", pa.float64()),
        "mask": _flatten(rows, "completion_mask", pa.bool_()),
        "topk_ids": _flatten(rows, "topk_ids", pa.list_(pa.int64())),
        "topk_logprobs": _flatten(rows, "topk_logprobs", pa.list_(pa.float64())),
    }
    suspects = _suspects(rows, flats)
    rejected: list[tuple[int, Quarantined]] = []
    for i in np.flatnonzero(suspects).tolist():
        try:
            validate(rows[i].sample)
            suspects[i] = False  # the explainer finds nothing wrong: the row stays, as it always did
        except Quarantined as q:
            rejected.append((i, q))
    good = np.flatnonzero(~suspects)
    logprobs = _floored(flats["logprobs"].values)
    lp32 = logprobs.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    records, prompts = _digests(flats, lp32, good)
    group_ids = [
        prompts[j] if samples[i].group_key is None else samples[i].group_key for j, i in enumerate(good.tolist())
    ]
    full = _assemble(rows, flats, logprobs, ingested_at_ms)
    batch = full if len(good) == len(rows) else full.take(pa.array(good))  # all good: no copy
    columns = {name: batch.column(name) for name in TRACES.names}
    columns["group_id"] = pa.array(group_ids, pa.string())
    columns["record_digest"] = pa.array(records, pa.string())
    batch = pa.RecordBatch.from_arrays([columns[n] for n in TRACES.names], schema=TRACES)
    return Checked(batch, good, rejected)


def _assemble(rows: Sequence[Located], flats: dict[str, _Flat], logprobs: pa.Array, now_ms: int) -> pa.RecordBatch:
    """Every input row as a traces batch (``group_id`` and ``record_digest`` left empty, set for good rows)."""
    samples = [r.sample for r in rows]
    n = len(samples)
    ids32 = {k: flats[k].values.cast(pa.int32(), safe=False) for k in ("prompt", "completion")}
    blank = pa.array([""] * n, pa.string())
    columns = {
        "sample_id": pa.array([sample_id_of(s) for s in samples], pa.string()),
        "request_id": pa.array([s.request_id for s in samples], pa.string()),
        "choice_index": pa.array([s.choice_index for s in samples], pa.int32()),
        "session_id": pa.array([s.session_id for s in samples], pa.string()),
        "turn": pa.array([s.turn for s in samples], pa.int32()),
        "agent_id": pa.array([s.agent_id for s in samples], pa.string()),
        "group_id": blank,
        "policy_version": pa.array([s.policy_version for s in samples], pa.string()),
        "policy_version_spans": pa.array([s.policy_version_spans for s in samples], pa.list_(VERSION_SPAN)),
        "model": pa.array([s.model for s in samples], pa.string()),
        "created_at": pa.array([s.created_at_us for s in samples], pa.int64()).cast(TIMESTAMP_US),
        "prompt_token_ids": _list(flats["prompt"], ids32["prompt"]),
        "completion_token_ids": _list(flats["completion"], ids32["completion"]),
        "completion_logprobs": _list(flats["logprobs"], logprobs),
        "completion_mask": _list(flats["mask"], flats["mask"].values),
        "topk_ids": _head_column(flats["topk_ids"], pa.int32(), logprobs=False),
        "topk_logprobs": _head_column(flats["topk_logprobs"], pa.float32(), logprobs=True),
        "finish_reason": pa.array([s.finish_reason for s in samples], pa.string()),
        "temperature": pa.array([s.temperature for s in samples], pa.float32()),
        "top_p": pa.array([s.top_p for s in samples], pa.float32()),
        "top_k": pa.array([s.top_k for s in samples], pa.int32()),
        "logprobs_mode": pa.array([s.logprobs_mode for s in samples], pa.string()),
        "messages": pa.array([s.messages for s in samples], pa.string()),
        "completion_text": pa.array([s.completion_text for s in samples], pa.string()),
        "record_digest": blank,
        "source_uri": pa.array([r.source_uri for r in rows], pa.string()),
        "source_line": pa.array([r.source_line for r in rows], pa.int64()),
        "source_format": pa.array([r.source_format for r in rows], pa.string()),
        "ingested_at": pa.array(np.full(n, now_ms, dtype=np.int64)).cast(TIMESTAMP_MS),
    }
    return pa.RecordBatch.from_pydict(columns)


__all__ = ["Checked", "check_and_assemble"]
