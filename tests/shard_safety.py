"""The safe-values rule, checked independently of prl's code: no shard row has a null or non-finite
``behavior_logprobs``, ``ref_logprobs``, ``kl`` or ``token_advantages`` at a position whose ``loss_mask`` is true.
``tests/conftest.py`` runs :func:`unsafe_values` over every shard file the suite's tests built."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

CHECKED = ("behavior_logprobs", "ref_logprobs", "kl", "token_advantages")


def unsafe_values(path: Path) -> list[str]:
    """Problems in one shard file, each naming the column, sample and position (plain Python: obviously right)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid):
        return []  # a file a test damaged on purpose is not a shard
    if "loss_mask" not in table.column_names:
        return []
    problems = []
    masks = table["loss_mask"].to_pylist()
    ids = table["sample_id"].to_pylist()
    for name in (c for c in CHECKED if c in table.column_names):
        column = table[name]
        if column.null_count == len(column):
            continue  # the set does not carry this column (KL off)
        for sid, mask, values in zip(ids, masks, column.to_pylist(), strict=True):
            for pos, on in enumerate(mask or []):
                value = None if values is None or pos >= len(values) else values[pos]
                if on and (value is None or not math.isfinite(value)):
                    problems.append(f"{path}: {name} of {sid} at {pos} is {value!r} inside loss_mask")
    return problems


def unsafe_shards(root: Path) -> list[str]:
    """Problems in every ``part-*.parquet`` under ``root``."""
    return [p for path in sorted(root.rglob("part-*.parquet")) for p in unsafe_values(path)]
