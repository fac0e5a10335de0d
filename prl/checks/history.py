"""Trajectories and previous steps for the ``prefix`` check, with bounded memory.

A trajectory is the rows of one (``session_id``, ``agent_id``): one agent's calls inside a session, so that the
agents of a multi-agent session are checked independently. Within a trajectory rows are ordered by

1. the explicit ``turn`` when the trajectory's rows carry one (rows with the same turn are one step: the choices
   or samples of that turn);
2. else ``created_at``, compared at the coarsest resolution the trajectory's rows carry (whole seconds when any
   row's time is a whole second, as OpenAI-style ``created`` is; milliseconds otherwise), so that a seconds-only
   time never outranks a finer one; ties are broken by arrival (``source_uri``, then ``source_line``) and then by
   prompt length (several turns of one rollout line). Rows of one record (n > 1 choices) are one step.

A row whose predecessor cannot be determined is never skipped silently: :func:`trajectory_index` names why
(``UNDETERMINED``) and the check reports it (reason ``prefix_unordered``).

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

TRAJECTORY = ["session_id", "agent_id"]
KEY_COLUMNS = ["sample_id", "request_id", "session_id", "agent_id", "turn", "created_at", "source_uri", "source_line"]

NO_TURN = "no_turn"
NO_TIMESTAMP = "no_timestamp"
ACROSS_FILES = "across_files"
PREVIOUS_MISSING = "previous_missing"
UNDETERMINED = {
    NO_TURN: "other rows of its trajectory carry a turn and this one does not",
    NO_TIMESTAMP: "other rows of its trajectory carry a timestamp and this one does not",
    ACROSS_FILES: "no turn and no timestamp, and the previous row by arrival is in another source file",
    PREVIOUS_MISSING: "the previous step's tokens are not in the traces table",
}
"""Why a row's predecessor cannot be determined."""

INDEX_SCHEMA = pl.Schema(
    [("sample_id", pl.String()), ("previous", pl.List(pl.String())), ("undetermined", pl.String())]
)
_STEP_KEYS = ["_k_turn", "_k_time", "source_uri", "source_line", "_k_plen"]


def _keys(store: Store, version: int) -> pl.DataFrame:
    """The key columns of rows with a session (``agent_id`` null in tables written before it existed)."""
    dataset = store.dataset("traces", version)
    names = set(dataset.schema.names) if dataset is not None else set()
    columns = [c for c in KEY_COLUMNS if c in names or dataset is None]
    keys = store.read("traces", columns=columns, filter=pc.field("session_id").is_valid(), version=version)
    df = pl.from_arrow(keys)
    assert isinstance(df, pl.DataFrame)
    if "agent_id" not in df.columns:
        df = df.with_columns(pl.lit(None, pl.String).alias("agent_id"))
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


def with_order_keys(keys: pl.DataFrame) -> pl.DataFrame:
    """``keys`` (the ``KEY_COLUMNS``) plus the per-trajectory order keys ``_turns`` (the trajectory is ordered by
    turn), ``_timed`` (some row has a time), ``_k_time`` (time at the trajectory's coarsest resolution), ``_tie``
    (another request shares this row's time and arrival: prompt length decides) and ``undetermined``."""
    ms = pl.col("created_at").cast(pl.Int64)
    df = keys.with_columns(
        pl.col("turn").is_not_null().any().over(TRAJECTORY).alias("_turns"),
        ms.is_not_null().any().over(TRAJECTORY).alias("_timed"),
        (ms % 1000 == 0).any().over(TRAJECTORY).fill_null(False).alias("_coarse"),
    )
    df = df.with_columns(
        pl.when(pl.col("_turns")).then(None).when(pl.col("_coarse")).then(ms // 1000).otherwise(ms).alias("_k_time"),
        pl.when(pl.col("_turns") & pl.col("turn").is_null())
        .then(pl.lit(NO_TURN))
        .when(~pl.col("_turns") & pl.col("_timed") & ms.is_null())
        .then(pl.lit(NO_TIMESTAMP))
        .otherwise(None)
        .alias("undetermined"),
    )
    return df.with_columns(
        (
            ~pl.col("_turns")
            & (pl.col("request_id").n_unique().over([*TRAJECTORY, "_k_time", "source_uri", "source_line"]) > 1)
        ).alias("_tie")
    )


def order_steps(df: pl.DataFrame) -> pl.DataFrame:
    """The previous step of every row of :func:`with_order_keys`'s frame that has ``prompt_len`` (needed where
    ``_tie``). Returns DataFrame(sample_id, previous: list[str] | null, undetermined: str | null) for the rows
    that have a previous step or cannot be placed; first rows of their trajectory are left out."""
    placed = (
        df.filter(pl.col("undetermined").is_null())
        .with_columns(
            pl.when(pl.col("_turns")).then(pl.col("turn").cast(pl.Int64)).alias("_k_turn"),
            pl.when(pl.col("_turns")).then(None).otherwise(pl.col("source_uri")).alias("source_uri"),
            pl.when(pl.col("_turns")).then(None).otherwise(pl.col("source_line")).alias("source_line"),
            pl.when(pl.col("_tie")).then(pl.col("prompt_len")).alias("_k_plen"),
            pl.col("source_uri").alias("_uri"),
        )
        .sort([*TRAJECTORY, *_STEP_KEYS, "sample_id"], nulls_last=True)
    )
    changed = [pl.col(c).ne_missing(pl.col(c).shift(1)) for c in [*TRAJECTORY, *_STEP_KEYS]]
    placed = placed.with_columns(pl.any_horizontal(changed).fill_null(True).cum_sum().alias("_step"))
    steps = (
        placed.group_by("_step", maintain_order=True)
        .agg(
            pl.col("session_id").first(),
            pl.col("agent_id").first(),
            pl.col("sample_id").alias("ids"),
            pl.col("_uri").first(),
            pl.col("_turns").first(),
            pl.col("_timed").first(),
        )
        .sort("_step")
    )
    same = pl.col("session_id").eq_missing(pl.col("session_id").shift(1)) & pl.col("agent_id").eq_missing(
        pl.col("agent_id").shift(1)
    )
    across = same & ~pl.col("_turns") & ~pl.col("_timed") & pl.col("_uri").ne_missing(pl.col("_uri").shift(1))
    steps = steps.with_columns(
        pl.when(same & ~across).then(pl.col("ids").shift(1)).alias("previous"),
        pl.when(across).then(pl.lit(ACROSS_FILES)).alias("undetermined"),
    ).select("_step", "previous", "undetermined")
    ordered = placed.select("sample_id", "_step").join(steps, on="_step").drop("_step")
    unplaced = df.filter(pl.col("undetermined").is_not_null()).select(
        "sample_id", pl.lit(None, pl.List(pl.String)).alias("previous"), "undetermined"
    )
    out = pl.concat([ordered, unplaced], how="vertical_relaxed")
    return out.filter(pl.col("previous").is_not_null() | pl.col("undetermined").is_not_null())


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


def trajectory_order(keys: pl.DataFrame) -> pl.DataFrame:
    """The order in which turns merge (``[shards] merge_turns``): ``keys`` holds the ``KEY_COLUMNS`` and
    ``prompt_len`` of N rows; returns DataFrame(row: int64 index into ``keys``, trajectory: int64) with every row
    once, a trajectory's rows consecutive and in their order (:func:`order_steps`' keys). Rows without a session,
    and rows whose predecessor cannot be determined, are trajectories of their own."""
    df = with_order_keys(keys.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64)))
    alone = pl.col("session_id").is_null() | pl.col("undetermined").is_not_null()
    df = df.with_columns(
        pl.when(pl.col("_turns")).then(pl.col("turn").cast(pl.Int64)).alias("_k_turn"),
        pl.when(pl.col("_tie")).then(pl.col("prompt_len")).alias("_k_plen"),
        pl.when(alone).then(pl.col("row")).alias("_alone"),
    )
    df = df.sort([*TRAJECTORY, "_alone", *_STEP_KEYS, "sample_id"], nulls_last=True)
    changed = [pl.col(c).ne_missing(pl.col(c).shift(1)) for c in [*TRAJECTORY, "_alone"]]
    return df.select("row", pl.any_horizontal(changed).fill_null(True).cum_sum().cast(pl.Int64).alias("trajectory"))
