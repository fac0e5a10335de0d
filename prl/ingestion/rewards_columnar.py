"""Columnar reading of reward JSONL blocks in the common shapes, without Python per row.

A block of whole lines (as :meth:`prl.io.sources.LineReader.blocks` yields it) is parsed by
``pyarrow.json.read_json`` at once when every line is an object of one of these shapes, with no null, missing or
non-finite value and no blank line:

- ``{"sample_id": str, "reward": number, "created_at"?: epoch seconds or ms}`` (name ``reward``);
- ``{"sample_id": str, "name": str, "value": number, "created_at"?: ...}``.

Anything else in the block (a component dict, ``request_id`` keys, ISO timestamps, a bad row) returns None, and
the caller reads that block line by line with :func:`prl.ingestion.side_tables.reward_events`, which explains
each bad row; the rows a block yields here are exactly the events that function would make of them.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from prl.event_ids import Occurrences, reward_ids
from prl.formats.fields import _MS_LIMIT, _MS_THRESHOLD
from prl.schema import REWARDS

NUMBER_TYPES = (pa.int64(), pa.float64())
SLOW_KEYS = {"rewards", "components", "timestamp"}
"""Keys that change how a row is read: their blocks take the per-row path."""


def _lines(block: bytes) -> int:
    return block.count(b"\n") + (0 if block.endswith(b"\n") else 1)


def _numbers(column: pa.ChunkedArray) -> np.ndarray | None:
    """float64[N] of a numeric column without nulls or non-finite values, else None."""
    if column.type not in NUMBER_TYPES or column.null_count:
        return None
    values = column.to_numpy().astype(np.float64, copy=False)
    return values if np.isfinite(values).all() else None


def _created_ms(table: pa.Table, now_ms: int) -> np.ndarray | None:
    """int64[N] event times as :func:`prl.formats.fields.timestamp_ms` reads epoch numbers; None if any is not one."""
    if "created_at" not in table.column_names:
        return np.full(table.num_rows, now_ms, dtype=np.int64)
    column = table.column("created_at")
    if column.type == pa.int64() and not column.null_count:
        raw = column.to_numpy()
        ms = np.where(raw > _MS_THRESHOLD, raw, raw * 1000)
        return ms if ((raw >= 0) & (ms < _MS_LIMIT)).all() else None
    values = _numbers(column)
    if values is None or (values < 0).any():
        return None
    ms = np.round(np.where(values > _MS_THRESHOLD, values, values * 1000.0))
    return ms.astype(np.int64) if (ms < _MS_LIMIT).all() else None


def reward_block(
    block: bytes, first_line: int, uri: str, now_ms: int, occurrences: Occurrences | None = None
) -> tuple[pa.RecordBatch, np.ndarray] | None:
    """The block's reward events as a ``rewards`` batch and the line number of each row (int64[N]), or None
    when the block must be read row by row. With ``occurrences`` (the file's, see
    :mod:`prl.event_ids`), ``event_id`` is filled in; else it is null."""
    if not block.strip():
        return None
    try:
        table = pj.read_json(io.BytesIO(block), read_options=pj.ReadOptions(block_size=len(block) + 1))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    n = table.num_rows
    names = set(table.column_names)
    if n != _lines(block) or names & SLOW_KEYS or "sample_id" not in names:
        return None
    ids = table.column("sample_id")
    if ids.type != pa.string() or ids.null_count or pc.any(pc.equal(pc.utf8_length(ids), 0)).as_py():
        return None
    if "name" in names and "value" in names:
        name_col = table.column("name")
        if name_col.type != pa.string() or name_col.null_count:
            return None
        event_names: pa.Array | pa.ChunkedArray = name_col
        values = _numbers(table.column("value"))
    elif "name" in names or "value" in names or "reward" not in names:
        return None
    else:
        event_names = pa.array(["reward"] * n, pa.string())
        values = _numbers(table.column("reward"))
    created = _created_ms(table, now_ms)
    if values is None or created is None:
        return None
    lines = np.arange(first_line, first_line + n, dtype=np.int64)
    ts = REWARDS.field("created_at").type
    columns = [
        ids.combine_chunks(),
        event_names.combine_chunks() if isinstance(event_names, pa.ChunkedArray) else event_names,
        pa.array(values),
        pa.array(created).cast(ts),
        pa.repeat(pa.scalar(uri, pa.string()), n),
        pa.array(lines),
        pa.array(np.full(n, now_ms, dtype=np.int64)).cast(ts),
        pa.nulls(n, pa.string()),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=REWARDS)
    if occurrences is not None:
        ids = reward_ids(batch, np.full(n, "created_at" in names), occurrences)
        batch = batch.set_column(batch.schema.get_field_index("event_id"), "event_id", ids)
    return batch, lines


__all__ = ["reward_block"]
