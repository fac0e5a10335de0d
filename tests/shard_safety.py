"""The safe-values rule, checked independently of prl's code: no shard row has a null or non-finite
``behavior_logprobs``, ``ref_logprobs``, ``kl`` or ``token_advantages`` at a position whose ``loss_mask`` is true.
``tests/conftest.py`` runs :func:`unsafe_values` over every shard file the suite's tests built.

A file is first read for its schema alone (store data files and damaged files are no shards), then for the
checked columns; :func:`_clean` clears a column in a few Arrow calls when every row's values line up with its
mask and every masked value is finite; any other column goes through the plain Python walk of
:func:`_walk`, which names each problem (and is the rule, obviously right)."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

CHECKED = ("behavior_logprobs", "ref_logprobs", "kl", "token_advantages")


def _walk(path: Path, name: str, ids: list, masks: list, values_by_row: list) -> list[str]:
    """The rule, row by row and position by position; one problem string per unsafe position."""
    problems = []
    for sid, mask, values in zip(ids, masks, values_by_row, strict=True):
        for pos, on in enumerate(mask or []):
            value = None if values is None or pos >= len(values) else values[pos]
            if on and (value is None or not math.isfinite(value)):
                problems.append(f"{path}: {name} of {sid} at {pos} is {value!r} inside loss_mask")
    return problems


def _clean(mask: pa.ChunkedArray, column: pa.ChunkedArray) -> bool:
    """True when every row has non-null values exactly as long as its mask (a null mask counting as empty) and
    every value at a true mask position is non-null and finite: then :func:`_walk` finds nothing."""
    mask_lengths = pc.fill_null(pc.list_value_length(mask), 0)
    aligned = pc.fill_null(pc.equal(pc.list_value_length(column), mask_lengths), False)  # null values: not aligned
    if not pc.all(aligned).as_py():
        return False
    on = pc.fill_null(pc.list_flatten(mask), False)
    values = pc.list_flatten(column)
    safe = pc.fill_null(pc.is_finite(values), False)  # a null value is unsafe
    return not pc.any(pc.and_(on, pc.invert(safe))).as_py()


def unsafe_values(path: Path) -> list[str]:
    """Problems in one shard file, each naming the column, sample and position."""
    try:
        with pq.ParquetFile(path) as parquet:
            names = parquet.schema_arrow.names
            if "loss_mask" not in names:
                return []
            checked = [c for c in CHECKED if c in names]
            table = parquet.read(columns=["sample_id", "loss_mask", *checked])
    except (OSError, pa.ArrowInvalid):
        return []  # a file a test damaged on purpose is not a shard
    problems: list[str] = []
    for name in checked:
        column = table[name]
        if column.null_count == len(column):
            continue  # the set does not carry this column (KL off)
        if _clean(table["loss_mask"], column):
            continue
        ids, masks = table["sample_id"].to_pylist(), table["loss_mask"].to_pylist()
        problems += _walk(path, name, ids, masks, column.to_pylist())
    return problems


def unsafe_shards(root: Path) -> list[str]:
    """Problems in every ``part-*.parquet`` under ``root``."""
    return [p for path in sorted(root.rglob("part-*.parquet")) for p in unsafe_values(path)]
