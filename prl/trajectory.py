"""Trajectories, the order of their steps, and how a step's prompt continues the previous one: what check-tokens'
``prefix`` check and build-shards' merged turns share.

A trajectory is the rows of one (``session_id``, ``agent_id``): one agent's calls inside a session, so that the
agents of a multi-agent session are ordered independently. Within a trajectory rows are ordered by

1. the explicit ``turn`` when the trajectory's rows carry one (rows with the same turn are one step: the choices
   or samples of that turn);
2. else ``created_at``, compared at the coarsest resolution the trajectory's rows carry (whole seconds when any
   row's time is a whole second, as OpenAI-style ``created`` is; else milliseconds when any row's time is a whole
   millisecond; else microseconds), so that a coarser time never outranks a finer one; ties are broken by arrival
   (``source_uri``, then ``source_line``) and then by prompt length (several turns of one rollout line). Rows of
   one record (n > 1 choices) are one step.

A row whose predecessor cannot be determined is never skipped silently: it is named with why (``UNDETERMINED``).

A step's prompt continues the previous step (its prompt + completion) ``CLEAN`` (a bit-exact prefix), ``REALIGN``
(the first difference lies in the last few tokens of the previous completion, e.g. a re-rendered end-of-turn) or
``FORK`` (the history was re-rendered or edited earlier: a new trajectory starts there).
"""

from __future__ import annotations

import numpy as np
import polars as pl

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

_STEP_KEYS = ["_k_turn", "_k_time", "source_uri", "source_line", "_k_plen"]

CLEAN, REALIGN, FORK = "CLEAN", "REALIGN", "FORK"


def with_order_keys(keys: pl.DataFrame) -> pl.DataFrame:
    """``keys`` (the ``KEY_COLUMNS``, ``created_at`` a Datetime column as the store reads it) plus the
    per-trajectory order keys ``_turns`` (the trajectory is ordered by turn), ``_timed`` (some row has a time),
    ``_k_time`` (time at the trajectory's coarsest resolution), ``_tie`` (another request shares this row's time
    and arrival: prompt length decides) and ``undetermined``."""
    us = pl.col("created_at").dt.cast_time_unit("us").cast(pl.Int64)
    df = keys.with_columns(
        pl.col("turn").is_not_null().any().over(TRAJECTORY).alias("_turns"),
        us.is_not_null().any().over(TRAJECTORY).alias("_timed"),
        (us % 1_000_000 == 0).any().over(TRAJECTORY).fill_null(False).alias("_seconds"),
        (us % 1_000 == 0).any().over(TRAJECTORY).fill_null(False).alias("_millis"),
    )
    df = df.with_columns(
        pl.when(pl.col("_turns"))
        .then(None)
        .when(pl.col("_seconds"))
        .then(us // 1_000_000)
        .when(pl.col("_millis"))
        .then(us // 1_000)
        .otherwise(us)
        .alias("_k_time"),
        pl.when(pl.col("_turns") & pl.col("turn").is_null())
        .then(pl.lit(NO_TURN))
        .when(~pl.col("_turns") & pl.col("_timed") & us.is_null())
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


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


def classify_prefix(prev_seq: np.ndarray, prev_prompt_len: int, prompt: np.ndarray, window: int) -> tuple[str, int]:
    """(status, first divergent prompt position; -1 when CLEAN)."""
    at = common_prefix(prev_seq, prompt)
    if at == len(prev_seq):
        return CLEAN, -1
    if at >= prev_prompt_len and at >= len(prev_seq) - window:
        return REALIGN, at
    return FORK, at


__all__ = [
    "ACROSS_FILES",
    "CLEAN",
    "FORK",
    "KEY_COLUMNS",
    "NO_TIMESTAMP",
    "NO_TURN",
    "PREVIOUS_MISSING",
    "REALIGN",
    "TRAJECTORY",
    "UNDETERMINED",
    "classify_prefix",
    "common_prefix",
    "order_steps",
    "trajectory_order",
    "with_order_keys",
]
