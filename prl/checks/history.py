"""Previous steps for the ``prefix`` check, with bounded memory (trajectories and their order:
:mod:`prl.trajectory`).

1. :func:`trajectory_index` reads only the key columns of rows that carry a session and names each row's previous
   step (its sample_ids). Memory: a few dozen bytes per multi-turn row, no tokens; prompt lengths are read only
   for rows whose other keys tie.
2. :class:`SequenceCache` keeps prompt + completion IDs of recently streamed multi-turn rows, least recently
   used first out, under a token budget. Traces are written in arrival order, so a turn's predecessor is
   almost always in the same or a recent batch; the rest (earlier runs' rows, out-of-order data) are fetched
   with one filtered scan per batch that needs them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from prl.checks.arrays import concat_rows, ragged
from prl.store.tables import Store
from prl.trajectory import (
    KEY_COLUMNS,
    order_steps,
    with_order_keys,
)

INDEX_SCHEMA = pl.Schema(
    [("sample_id", pl.String()), ("previous", pl.List(pl.String())), ("undetermined", pl.String())]
)


def _keys(store: Store, version: int) -> pl.DataFrame:
    """The key columns of rows with a session."""
    keys = store.read("traces", columns=list(KEY_COLUMNS), filter=pc.field("session_id").is_valid(), version=version)
    df = pl.from_arrow(keys)
    assert isinstance(df, pl.DataFrame)
    return df


def _prompt_lengths(store: Store, version: int, sample_ids: list[str]) -> pl.DataFrame:
    """DataFrame(sample_id, prompt_len) for ``sample_ids``, one filtered scan."""
    ids: list[pa.Array] = []
    lengths: list[pa.Array] = []
    flt = pc.field("sample_id").isin(pa.array(sample_ids, pa.string()))
    for part in store.scan("traces", columns=["sample_id", "prompt_token_ids"], filter=flt, version=version):
        ids.append(part.column("sample_id"))
        lengths.append(pc.list_value_length(part.column("prompt_token_ids")).cast(pa.int64()))
    if not ids:
        return pl.DataFrame(schema={"sample_id": pl.String, "prompt_len": pl.Int64})
    return pl.DataFrame(
        {
            "sample_id": pl.Series(pa.concat_arrays(ids)),
            "prompt_len": pl.Series(pa.concat_arrays(lengths)),
        }
    )


def trajectory_index(store: Store, version: int) -> pl.DataFrame:
    """DataFrame(sample_id, previous: list[str] | null, undetermined: str | null) of rows that carry a session
    and either have a previous step in their trajectory or cannot be placed in it (see the module docstring)."""
    keys = _keys(store, version)
    if keys.height == 0:
        return pl.DataFrame(schema=INDEX_SCHEMA)
    df = with_order_keys(keys)
    tied = df.filter(pl.col("_tie")).get_column("sample_id").to_list()
    if tied:
        df = df.join(_prompt_lengths(store, version, tied), on="sample_id", how="left")
    else:
        df = df.with_columns(pl.lit(None, pl.Int64).alias("prompt_len"))
    return order_steps(df).cast(INDEX_SCHEMA)


@dataclass
class SequenceCache:
    """sample_id → (prompt + completion IDs int32, prompt length), at most ``max_tokens`` tokens."""

    max_tokens: int = 1 << 24
    entries: OrderedDict[str, tuple[np.ndarray, int]] = field(default_factory=OrderedDict)
    tokens: int = 0
    fetches: int = 0

    def put(self, sample_id: str, seq: np.ndarray, prompt_len: int) -> None:
        if sample_id in self.entries:
            self.entries.move_to_end(sample_id)
            return
        self.entries[sample_id] = (seq, prompt_len)
        self.tokens += len(seq)
        while self.tokens > self.max_tokens and len(self.entries) > 1:
            _, (old, _) = self.entries.popitem(last=False)
            self.tokens -= len(old)

    def put_batch(self, batch: pa.RecordBatch | pa.Table, only: np.ndarray | None = None) -> None:
        """Cache rows of a batch with sample_id, prompt_token_ids, completion_token_ids (rows ``only``)."""
        prompt = ragged(batch.column("prompt_token_ids"), np.int32)
        seq = concat_rows(prompt, ragged(batch.column("completion_token_ids"), np.int32))
        ids = batch.column("sample_id").to_pylist()
        rows = range(len(ids)) if only is None else np.flatnonzero(only).tolist()
        plen = prompt.lengths
        for r in rows:
            self.put(ids[r], seq.row(r).copy(), int(plen[r]))

    def get_many(self, store: Store, version: int, wanted: Iterable[str]) -> dict[str, tuple[np.ndarray, int]]:
        """The wanted sequences, fetching the missing ones in one filtered scan of the traces table."""
        found: dict[str, tuple[np.ndarray, int]] = {}
        missing = []
        for sid in set(wanted):
            if sid in self.entries:
                self.entries.move_to_end(sid)
                found[sid] = self.entries[sid]
            else:
                missing.append(sid)
        if missing:
            self.fetches += 1
            flt = pc.field("sample_id").isin(pa.array(missing, pa.string()))
            for part in store.scan(
                "traces",
                columns=["sample_id", "prompt_token_ids", "completion_token_ids"],
                filter=flt,
                version=version,
            ):
                prompt = ragged(part.column("prompt_token_ids"), np.int32)
                seq = concat_rows(prompt, ragged(part.column("completion_token_ids"), np.int32))
                for r, sid in enumerate(part.column("sample_id").to_pylist()):
                    found[sid] = (seq.row(r).copy(), int(prompt.lengths[r]))
                    self.put(sid, *found[sid])
        return found


def previous_for(index: pl.DataFrame, sample_ids: list[str]) -> tuple[list[list[str] | None], list[str | None]]:
    """Per sample_id (in order): the previous step's sample_ids (or None), and why its predecessor cannot be
    determined (an ``UNDETERMINED`` key, or None)."""
    if index.height == 0:
        return [None] * len(sample_ids), [None] * len(sample_ids)
    probe = pl.DataFrame({"sample_id": sample_ids, "_i": np.arange(len(sample_ids))})
    joined = probe.join(index, on="sample_id", how="left").sort("_i")
    return joined.get_column("previous").to_list(), joined.get_column("undetermined").to_list()
