"""Validation of one parsed sample (the explainer of a bad row: :mod:`prl.ingestion.batch` validates whole
batches and asks this module why a row failed), and the digests that identify a record.

Validation never fixes data: the only normalisation is vLLM's ``-9999.0`` floor → null. Everything
else that is wrong sends the sample to quarantine with one reason code:

| reason | when |
|---|---|
| ``missing_group_field`` | ``--group-field`` names a field the record does not carry (set by ingest) |
| ``missing_finish_reason`` | the record has no finish reason and none was given with ``--finish-reason`` |
| ``no_prompt_ids`` / ``empty_completion`` | no prompt tokens / no completion tokens |
| ``bad_token_id`` | an ID < 0 or ≥ 2³¹ |
| ``length_mismatch`` | ``len(completion_logprobs) != len(completion_token_ids)`` |
| ``nonfinite_logprob`` | NaN or ±inf among the sampled logprobs |
| ``positive_logprob`` | a sampled logprob > 0 |
| ``topk_length_mismatch`` | top-k head rows do not match the completion length, or IDs and logprobs differ in shape |
| ``mask_length_mismatch`` | ``completion_mask`` length differs from the completion |
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prl.formats.base import ParseOptions, Quarantined, Sample
from prl.formats.guard import FLOAT32_MAX

VLLM_LOGPROB_FLOOR = -9999.0
INT32_MAX = 2**31 - 1


@dataclass(slots=True)
class Located:
    """A parsed sample with where it came from."""

    sample: Sample
    source_uri: str
    source_line: int
    source_format: str


def _floor_to_null(logprobs: pa.Array) -> pa.Array:
    floored = pc.equal(logprobs, VLLM_LOGPROB_FLOOR)  # the floor exactly: -10000.0 is a value, kept as sampled
    if pc.any(floored).as_py():
        return pc.if_else(floored, pa.scalar(None, pa.float64()), logprobs)
    return logprobs


def _check_float32(name: str, values: pa.Array | None) -> None:
    """Finite logprobs beyond float32's range would be stored as infinities: ``out_of_range``."""
    if values is None or len(values) == 0:
        return
    if pa.types.is_list(values.type):
        values = pc.list_flatten(values)
    if not pa.types.is_floating(values.type):
        return
    bounds = pc.min_max(pc.abs(pc.if_else(pc.is_finite(values), values, 0.0))).as_py()
    if bounds["max"] is not None and bounds["max"] > FLOAT32_MAX:
        raise Quarantined("out_of_range", f"{name} holds {bounds['max']:g} in magnitude, beyond float32")


def validate(sample: Sample) -> Sample:
    """Check one sample's arrays (vectorized per array). Returns the sample with the ``-9999`` floor nulled;
    raises :class:`Quarantined` otherwise."""
    n = len(sample.completion_token_ids)
    for name, values in (("completion_logprobs", sample.completion_logprobs), ("topk_logprobs", sample.topk_logprobs)):
        _check_float32(name, values)
    if sample.finish_reason is None:
        raise Quarantined(
            "missing_finish_reason",
            "the record carries no finish reason (pass --finish-reason to set one for such records)",
        )
    if len(sample.prompt_token_ids) == 0:
        raise Quarantined("no_prompt_ids", "the prompt has no token IDs")
    if n == 0:
        raise Quarantined("empty_completion", "the completion has no tokens")
    for what, ids in (("prompt", sample.prompt_token_ids), ("completion", sample.completion_token_ids)):
        bounds = pc.min_max(ids)
        if bounds["min"].as_py() < 0 or bounds["max"].as_py() > INT32_MAX:
            raise Quarantined("bad_token_id", f"{what} holds IDs outside [0, 2^31): {bounds}")
    if len(sample.completion_logprobs) != n:
        raise Quarantined("length_mismatch", f"{len(sample.completion_logprobs)} logprobs for {n} completion tokens")
    # nulls (no logprob given) are allowed; NaN, infinities and positive values are not
    values = pc.fill_null(sample.completion_logprobs, -1.0).to_numpy(zero_copy_only=False)
    finite = np.isfinite(values)
    if not finite.all():
        position = int(np.flatnonzero(~finite)[0])
        raise Quarantined("nonfinite_logprob", f"logprob {float(values[position])} at completion position {position}")
    positive = values > 0
    if positive.any():
        position = int(np.flatnonzero(positive)[0])
        raise Quarantined(
            "positive_logprob", f"logprob {float(values[position])} > 0 at completion position {position}"
        )
    sample.completion_logprobs = _floor_to_null(sample.completion_logprobs)
    if (sample.topk_ids is None) != (sample.topk_logprobs is None):
        raise Quarantined("topk_length_mismatch", "top-k IDs and logprobs must come together")
    if sample.topk_ids is not None and sample.topk_logprobs is not None:
        if len(sample.topk_ids) != n or len(sample.topk_logprobs) != n:
            raise Quarantined("topk_length_mismatch", f"{len(sample.topk_ids)} top-k rows for {n} tokens")
        if not pc.list_value_length(sample.topk_ids).equals(pc.list_value_length(sample.topk_logprobs)):
            raise Quarantined("topk_length_mismatch", "top-k IDs and logprobs differ in shape")
        flat_ids = pc.list_flatten(sample.topk_ids)
        if len(flat_ids):
            bounds = pc.min_max(flat_ids)
            if bounds["min"].as_py() < 0 or bounds["max"].as_py() > INT32_MAX:
                raise Quarantined("bad_token_id", "top-k head holds IDs outside [0, 2^31)")
        sample.topk_logprobs = pa.ListArray.from_arrays(
            sample.topk_logprobs.offsets, _floor_to_null(pc.list_flatten(sample.topk_logprobs))
        )
    if sample.completion_mask is not None and len(sample.completion_mask) != n:
        raise Quarantined("mask_length_mismatch", f"completion_mask has {len(sample.completion_mask)} entries")
    return sample


def _ids32(ids: pa.Array) -> np.ndarray:
    return ids.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)


def record_digest(sample: Sample) -> str:
    """sha256 over the token IDs (int32) and logprobs (float32, NaN for null) of a sample: equal digests mean
    the same sampled record."""
    h = hashlib.sha256()
    h.update(_ids32(sample.prompt_token_ids).tobytes())
    h.update(b"|")
    h.update(_ids32(sample.completion_token_ids).tobytes())
    h.update(b"|")
    h.update(sample.completion_logprobs.to_numpy(zero_copy_only=False).astype(np.float32).tobytes())
    return h.hexdigest()


def prompt_digest(prompt_ids: pa.Array) -> str:
    """Default centering group: a digest of the exact prompt token IDs."""
    return hashlib.sha256(_ids32(prompt_ids).tobytes()).hexdigest()[:32]


def sample_id_of(sample: Sample) -> str:
    return f"{sample.request_id}#{sample.choice_index}"


def list_column(arrays: list[pa.Array | None], value_type: pa.DataType) -> pa.Array:
    """A list column from per-row arrays (None → null row), built by one concatenation."""
    lengths = np.fromiter((0 if a is None else len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [a.cast(value_type) if a.type != value_type else a for a in arrays if a is not None]
    values = pa.concat_arrays(present) if present else pa.array([], value_type)
    mask = pa.array([a is None for a in arrays], pa.bool_()) if any(a is None for a in arrays) else None
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)


__all__ = ["Located", "ParseOptions", "list_column", "prompt_digest", "record_digest", "sample_id_of", "validate"]
