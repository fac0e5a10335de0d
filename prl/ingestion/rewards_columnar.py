"""Columnar reading of reward files in the common shapes, without Python per row.

A JSONL block of whole lines (as :meth:`prl.io.sources.LineReader.blocks` yields it) is parsed by
``pyarrow.json.read_json`` at once, and a CSV or Parquet batch is taken as Arrow reads it, when every row is one
of these shapes, with no null, missing or non-finite value (and, in JSONL, no blank line):

- ``{KEY, "reward": number, "created_at"?: epoch seconds or ms}`` (name ``reward``);
- ``{KEY, "name": str, "value": number, "created_at"?: ...}``;

where KEY is ``"sample_id": str`` or ``"request_id": str, "choice_index": int`` (sample ``request_id#choice_index``).

Anything else (a component dict, ISO timestamps, numbers written as strings, a bad row) returns None, and the
caller reads that block row by row with :func:`prl.ingestion.side_tables.reward_events`, which explains each bad
row; the rows a block yields here are exactly the events that function would make of them (the per-row reader
stays the reference: tests compare the two on generated files).
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from prl.event_ids import Occurrences, reward_ids
from prl.formats.fields import MS_LIMIT, MS_THRESHOLD
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


def _strings(column: pa.ChunkedArray) -> pa.Array | None:
    """A string column without nulls, as one array; else None."""
    if column.type not in (pa.string(), pa.large_string()) or column.null_count:
        return None
    return column.combine_chunks().cast(pa.string())


def _created_ms(table: pa.Table, now_ms: int) -> np.ndarray | None:
    """int64[N] event times as :func:`prl.formats.fields.timestamp_ms` reads epoch numbers; None if any is not one."""
    if "created_at" not in table.column_names:
        return np.full(table.num_rows, now_ms, dtype=np.int64)
    column = table.column("created_at")
    if column.type == pa.int64() and not column.null_count:
        raw = column.to_numpy()
        ms = np.where(raw > MS_THRESHOLD, raw, raw * 1000)
        return ms if ((raw >= 0) & (ms < MS_LIMIT)).all() else None
    values = _numbers(column)
    if values is None or (values < 0).any():
        return None
    ms = np.round(np.where(values > MS_THRESHOLD, values, values * 1000.0))
    return ms.astype(np.int64) if (ms < MS_LIMIT).all() else None


def json_block(block: bytes) -> pa.Table | None:
    """A JSONL block of whole lines as one Arrow table (a row per line), or None when Arrow cannot read it as
    that (a blank line, a line that is not an object, invalid JSON) or reads it into invalid arrays: Arrow 26's
    type inference builds a list whose offsets overrun its values from a list that starts with ``null``
    (``[null, 0.0]``), so the table is validated whole before any column is used."""
    if not block.strip():
        return None
    try:
        table = pj.read_json(io.BytesIO(block), read_options=pj.ReadOptions(block_size=len(block) + 1))
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return table if table.num_rows == _lines(block) else None


def _nonempty_strings(column: pa.ChunkedArray | pa.Array) -> pa.Array | None:
    """A string column without nulls or empty strings, as one array; else None."""
    if column.type not in (pa.string(), pa.large_string()) or column.null_count:
        return None
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(array) and pc.min(pc.utf8_length(array)).as_py() == 0:
        return None
    return array.cast(pa.string())


def sample_keys(table: pa.Table) -> pa.Array | None:
    """Each row's sample id as :func:`prl.ingestion.side_tables` keys it (``sample_id``, or ``request_id#choice_index``
    with an integer ``choice_index``), when every row has it the same way; else None."""
    names = set(table.column_names)
    if "sample_id" in names:
        return None if "request_id" in names else _nonempty_strings(table.column("sample_id"))
    if "request_id" not in names or "choice_index" not in names:
        return None
    request = _nonempty_strings(table.column("request_id"))
    choice = table.column("choice_index")
    if request is None or not pa.types.is_integer(choice.type) or choice.null_count:
        return None
    try:
        numbers = choice.combine_chunks().cast(pa.int64())
    except pa.ArrowInvalid:  # an unsigned integer past int64
        return None
    return pc.binary_join_element_wise(request, numbers.cast(pa.string()), "#")


def reward_block(
    block: bytes, first_line: int, uri: str, now_ms: int, occurrences: Occurrences | None = None
) -> tuple[pa.RecordBatch, np.ndarray] | None:
    """The block's reward events as a ``rewards`` batch and the line number of each row (int64[N]), or None
    when the block must be read row by row. With ``occurrences`` (the file's, see
    :mod:`prl.event_ids`), ``event_id`` is filled in; else it is null."""
    table = json_block(block)
    return None if table is None else reward_table(table, first_line, uri, now_ms, occurrences)


def reward_table(
    table: pa.Table, first_line: int, uri: str, now_ms: int, occurrences: Occurrences | None = None
) -> tuple[pa.RecordBatch, np.ndarray] | None:
    """:func:`reward_block` of rows already in Arrow (a JSONL block, a CSV or Parquet batch), numbered from
    ``first_line``."""
    n = table.num_rows
    names = set(table.column_names)
    if not n or names & SLOW_KEYS:
        return None
    ids = sample_keys(table)
    if ids is None:
        return None
    if "name" in names and "value" in names:
        event_names = _strings(table.column("name"))
        if event_names is None:
            return None
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
        ids,
        event_names,
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


__all__ = ["json_block", "reward_block", "reward_table", "sample_keys"]
