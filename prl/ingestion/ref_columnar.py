"""Columnar reading of reference-logprob files in the common shape, without Python per row.

A JSONL block of whole lines, or a CSV or Parquet batch as Arrow reads it, is taken at once when every row is
``{KEY, "ref_model": str, "ref_logprobs": [number, ...]}`` (KEY as in :mod:`prl.ingestion.rewards_columnar`:
``sample_id``, or ``request_id`` + integer ``choice_index``) with no null, no empty model, and every logprob
finite and at most 0. Anything else (``model`` / ``logprobs`` spellings, a bad row) returns None, and the caller
reads that block row by row with :func:`prl.ingestion.side_tables.ref_row`, which explains each bad row; the
rows a block yields here are exactly the rows that function (and the per-row batch) would make of them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prl.event_ids import ref_ids
from prl.formats.guard import FLOAT32_MAX
from prl.ingestion.rewards_columnar import json_block, sample_keys
from prl.schema import REF_LOGPROBS

SLOW_KEYS = {"model", "logprobs"}
"""Other spellings the per-row reader takes: their blocks take that road."""


def _logprobs(column: pa.ChunkedArray) -> pa.ListArray | None:
    """The logprob lists as float64 (as the per-row reader validates them): no null list or entry, every value
    finite, at most 0 and within float32's range (the stored type); else None."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or column.null_count:
        return None
    value_type = column.type.value_type
    if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
        return None
    array = column.combine_chunks()
    values = array.flatten()
    if values.null_count:
        return None
    numbers = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    if not np.isfinite(numbers).all() or (numbers > 0).any() or (numbers < -FLOAT32_MAX).any():
        return None
    offsets = np.zeros(len(array) + 1, dtype=np.int32)
    np.cumsum(pc.list_value_length(array).to_numpy(zero_copy_only=False), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(numbers, pa.float64()))


def ref_block(block: bytes, first_line: int, uri: str, now_ms: int) -> pa.RecordBatch | None:
    """The block's reference rows as a ``ref_logprobs`` batch (``event_id`` filled in), or None when it must
    be read row by row."""
    table = json_block(block)
    return None if table is None else ref_table(table, first_line, uri, now_ms)


def ref_table(table: pa.Table, first_line: int, uri: str, now_ms: int) -> pa.RecordBatch | None:
    """:func:`ref_block` of rows already in Arrow (a JSONL block, a CSV or Parquet batch), numbered from
    ``first_line``."""
    n = table.num_rows
    names = set(table.column_names)
    if not n or names & SLOW_KEYS or "ref_model" not in names or "ref_logprobs" not in names:
        return None
    ids = sample_keys(table)
    models = table.column("ref_model")
    if ids is None or models.type not in (pa.string(), pa.large_string()) or models.null_count:
        return None
    models = models.combine_chunks().cast(pa.string())
    if pc.min(pc.utf8_length(models)).as_py() == 0:
        return None
    logprobs = _logprobs(table.column("ref_logprobs"))
    if logprobs is None:
        return None
    stored = logprobs.cast(REF_LOGPROBS.field("ref_logprobs").type)
    ts = REF_LOGPROBS.field("ingested_at").type
    columns = {
        "sample_id": ids,
        "ref_model": models,
        "ref_logprobs": stored,
        "source_uri": pa.repeat(pa.scalar(uri, pa.string()), n),
        "source_line": pa.array(np.arange(first_line, first_line + n, dtype=np.int64)),
        "ingested_at": pa.array(np.full(n, now_ms, dtype=np.int64)).cast(ts),
        "event_id": ref_ids(ids.to_pylist(), models.to_pylist(), logprobs),
    }
    return pa.RecordBatch.from_pydict(columns, schema=REF_LOGPROBS)


__all__ = ["ref_block", "ref_table"]
