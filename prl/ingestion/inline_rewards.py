"""Rewards that trace records carry inline (a NeMo Gym rollout's ``reward``): the ``rewards`` rows of the samples a
trace ingest keeps, written in the same ingest, before its traces commit.

A run killed between the two commits reads its files again and writes the same events again: identical
events (same sample, name, value and time), which supersede each other to the same value.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from prl.event_ids import reward_id
from prl.formats.base import Quarantined, Sample
from prl.formats.guard import is_unicode
from prl.schema import REWARDS


def inline_reward_rows(
    sample: Sample, sample_id: str, source_uri: str, source_line: int, now_ms: int
) -> list[dict[str, Any]]:
    """``rewards`` rows for one kept sample (none when it carries no rewards). ``created_at`` is the sample's
    own time, else ``now_ms``. Raises :class:`Quarantined` (``bad_value``, ``nonfinite_reward``: the reason
    codes of ``prl ingest --kind rewards``) for a value that is not a finite number."""
    if not sample.rewards:
        return []
    # the sample's own time in milliseconds, as timestamp_ms read it (timestamp_us keeps within ±499 µs of that)
    own_ms = None if sample.created_at_us is None else (sample.created_at_us + 500) // 1000
    created = own_ms if own_ms is not None else now_ms
    rows = []
    for name, value in sample.rewards.items():
        if not isinstance(name, str) or not is_unicode(name):
            raise Quarantined("bad_string", f"reward name {name!r} is not valid Unicode (a lone UTF-16 surrogate)")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Quarantined("bad_value", f"reward {name!r} is {type(value).__name__}, not a number")
        if not math.isfinite(value):
            raise Quarantined("nonfinite_reward", f"reward {name!r} is {value}")
        rows.append(
            {
                "sample_id": sample_id,
                "name": name,
                "value": float(value),
                "created_at": created,
                "source_uri": source_uri,
                "source_line": source_line,
                "ingested_at": now_ms,
                "event_id": reward_id(sample_id, name, float(value), own_ms),
            }
        )
    return rows


def reward_batches(rows: list[dict[str, Any]], size: int = 10_000) -> Iterator[pa.RecordBatch]:
    for start in range(0, len(rows), size):
        yield pa.RecordBatch.from_pylist(rows[start : start + size], schema=REWARDS)


__all__ = ["inline_reward_rows", "reward_batches"]
