"""Merged multi-turn rows (``[shards] merge_turns = true``): consecutive turns of a trajectory as one training row.

A trajectory is one agent's turns inside a session, in order (:mod:`prl.trajectory`). When a turn's prompt
extends the row built so far (CLEAN: the row's tokens, i.e. the previous turn's prompt + completion, are a prefix of
this prompt), the row grows by the prompt's new tail (the user, tool and observation tokens between completions:
loss mask 0, no logprob) and then this turn's completion (its own loss mask, logprobs, heads and reference
logprobs). The row is::

    input_ids = prompt_0 | completion_0 | tail_1 | completion_1 | tail_2 | completion_2 …
    prompt_len = len(prompt_0); every completion-aligned array covers everything after prompt_0.

This is tinker-cookbook's ``rl/data_processing.trajectory_to_data`` (one datum while each observation extends the
previous observation + action) and slime's ``agent/trajectory.py`` builder:

- REALIGN (the first difference lies in the last ``window`` tokens of the previous completion, at or after its
  start, e.g. a re-rendered end-of-turn): as slime does, the previous completion's span is overwritten from this
  prompt (trimmed to where the prompt goes) and masked: loss mask 0, no logprob; then this turn's completion follows.
- FORK (any earlier difference): the row ends; this turn starts a new one.

Rows are described by a gather map: per row position after the first prompt, the flat index of the completion
token it is (into the turns' concatenated completion arrays), or -1 for a token that is not sampled. Every
completion-aligned column of the turns (logprobs, masks, heads, reference logprobs, KL) becomes the merged column
with one vectorized take (:meth:`MergedRows.gather`). Per-turn work is a few numpy slices; no per-token Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from prl.shards.merge_sampling import settings_change
from prl.trajectory import CLEAN, KEY_COLUMNS, REALIGN, classify_prefix, trajectory_order

REWARD_MODES = ("last", "sum", "mean")
"""How a merged row's reward is taken from its turns' rewards: the last turn's, their sum or their mean."""


@dataclass(frozen=True)
class MergedRows:
    """``R`` merged rows built from ``N`` turns.

    ``input_ids_T`` / ``input_off_R1``: each row's tokens (first prompt + merged completion region) and offsets.
    ``prompt_len_R``: the first turn's prompt length. ``source_M`` / ``region_off_R1``: per completion-region position
    (``M`` = Σ (row length − prompt length)), the flat index into the turns' completion arrays, -1 where the token is
    not sampled. ``turns_K`` / ``turns_off_R1``: the turn indices each row holds, in order (``K`` = turns shipped;
    ``turns_K[turns_off_R1[r]]`` is row r's first turn). ``status_N``: how each turn joined its row (None: it starts
    one; CLEAN / REALIGN; FORK: it starts one because its history diverged). ``unmerged_tokens``: Σ (prompt +
    completion) of the turns, the tokens a trainer reads with one row per turn.
    """

    input_ids_T: np.ndarray
    input_off_R1: np.ndarray
    prompt_len_R: np.ndarray
    source_M: np.ndarray
    region_off_R1: np.ndarray
    turns_K: np.ndarray
    turns_off_R1: np.ndarray
    status_N: list[str | None]
    unmerged_tokens: int

    @property
    def rows(self) -> int:
        return len(self.prompt_len_R)

    @property
    def first_turn_R(self) -> np.ndarray:
        """The first turn of each row (int64[R]): its sample_id, group and prompt name the row."""
        return self.turns_K[self.turns_off_R1[:-1]]

    @property
    def last_turn_R(self) -> np.ndarray:
        """The last turn of each row (int64[R])."""
        return self.turns_K[self.turns_off_R1[1:] - 1]

    @property
    def sampled_M(self) -> np.ndarray:
        """bool[M]: the region position is a sampled completion token."""
        return self.source_M >= 0

    def gather(self, values_C: np.ndarray, fill: float | int | bool = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(values_M, sampled_M)``: a completion-aligned array of the turns (flat, length Σ completion lengths)
        laid out on the merged rows' regions; ``fill`` where the position is not a sampled token."""
        sampled = self.sampled_M
        out = np.full(len(self.source_M), fill, dtype=values_C.dtype)
        out[sampled] = values_C[self.source_M[sampled]]
        return out, sampled

    @property
    def merged_tokens(self) -> int:
        """Σ row lengths: the tokens a trainer reads with merged rows."""
        return int(self.input_off_R1[-1])


@dataclass
class _Builder:
    """The rows built so far and the open one: its tokens, its region's gather map, where its last completion
    starts."""

    tokens: list[np.ndarray]
    sources: list[np.ndarray]
    prompt_lens: list[int]
    turns: list[int]
    turns_off: list[int]
    held: np.ndarray
    held_src: np.ndarray
    prompt_len: int = 0
    last_start: int = 0

    def start(self, prompt: np.ndarray, completion: np.ndarray, src: np.ndarray) -> None:
        """Close the open row (if any) and open one with this turn."""
        if self.turns_off[-1] < len(self.turns):
            self.tokens.append(self.held)
            self.sources.append(self.held_src)
            self.prompt_lens.append(self.prompt_len)
            self.turns_off.append(len(self.turns))
        self.held, self.held_src, self.prompt_len = np.concatenate([prompt, completion]), src, len(prompt)

    def extend(self, kept: int, prompt: np.ndarray, completion: np.ndarray, src: np.ndarray) -> None:
        """Keep the row's first ``kept`` tokens, then this prompt's tokens after them (not sampled), then the
        completion."""
        tail = prompt[kept:]
        self.held = np.concatenate([self.held[:kept], tail, completion])
        gap = np.full(len(tail), -1, np.int64)
        self.held_src = np.concatenate([self.held_src[: kept - self.prompt_len], gap, src])

    def finish(self) -> None:
        self.start(self.held[:0], self.held[:0], self.held_src[:0])


def merge_turns(
    prompt_P: np.ndarray,
    prompt_off_N1: np.ndarray,
    completion_C: np.ndarray,
    completion_off_N1: np.ndarray,
    trajectory_N: np.ndarray,
    window: int = 4,
) -> MergedRows:
    """Merge ``N`` turns into rows. Turns of one trajectory are consecutive and in order; ``trajectory_N`` (any
    integer key) changes where a new trajectory starts, so a turn merges only with its predecessor in the same
    trajectory. ``prompt_P`` / ``completion_C``: flat token IDs with offsets ``*_off_N1`` (int64, N + 1).
    ``window``: the REALIGN window (``prl check-tokens``' ``realign_window``)."""
    n = len(trajectory_N)
    empty = np.empty(0, dtype=prompt_P.dtype)
    b = _Builder([], [], [], [], [0], empty, np.empty(0, np.int64))
    status: list[str | None] = [None] * n
    unmerged = 0
    for i in range(n):
        prompt = prompt_P[prompt_off_N1[i] : prompt_off_N1[i + 1]]
        c0, c1 = int(completion_off_N1[i]), int(completion_off_N1[i + 1])
        completion = completion_C[c0:c1]
        src = np.arange(c0, c1, dtype=np.int64)
        unmerged += len(prompt) + len(completion)
        joined = i > 0 and trajectory_N[i] == trajectory_N[i - 1]
        kind = classify_prefix(b.held, b.last_start, prompt, window)[0] if joined else None
        if kind == CLEAN:
            b.extend(len(b.held), prompt, completion, src)
        elif kind == REALIGN:  # slime: the previous completion's span is overwritten from this prompt, masked
            b.extend(b.last_start, prompt, completion, src)
        else:
            b.start(prompt, completion, src)
        status[i] = kind
        b.last_start = len(b.held) - len(completion)
        b.turns.append(i)
    b.finish()
    lengths = np.array([len(t) for t in b.tokens], dtype=np.int64)
    region = np.array([len(s) for s in b.sources], dtype=np.int64)
    return MergedRows(
        input_ids_T=np.concatenate(b.tokens) if b.tokens else empty,
        input_off_R1=_offsets(lengths),
        prompt_len_R=np.array(b.prompt_lens, dtype=np.int64),
        source_M=np.concatenate(b.sources) if b.sources else np.empty(0, np.int64),
        region_off_R1=_offsets(region),
        turns_K=np.array(b.turns, dtype=np.int64),
        turns_off_R1=np.array(b.turns_off, dtype=np.int64),
        status_N=status,
        unmerged_tokens=unmerged,
    )


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def combine_rewards(reward_N: np.ndarray, rows: MergedRows, mode: str = "last") -> np.ndarray:
    """float64[R]: each merged row's reward from its turns' rewards (``mode`` in :data:`REWARD_MODES`): the last
    turn's (an episode's outcome reward lands on its final call), their sum, or their mean."""
    if mode not in REWARD_MODES:
        raise ValueError(f"reward mode must be one of {', '.join(REWARD_MODES)}, not {mode!r}")
    if mode == "last":
        return reward_N[rows.last_turn_R].astype(np.float64)
    per_turn = reward_N[rows.turns_K].astype(np.float64)
    counts = np.diff(rows.turns_off_R1)
    sums = np.add.reduceat(per_turn, rows.turns_off_R1[:-1]) if len(counts) else np.zeros(0)
    return sums if mode == "sum" else sums / counts


def token_advantages(advantage_R: np.ndarray, rows: MergedRows, mask_M: np.ndarray | None = None) -> np.ndarray:
    """float32[M]: each row's advantage on its sampled tokens (and where ``mask_M``, e.g. a completion's own loss
    mask, holds), 0.0 on every token between completions."""
    per = np.repeat(advantage_R.astype(np.float32), np.diff(rows.region_off_R1))
    keep = rows.sampled_M if mask_M is None else rows.sampled_M & mask_M
    return np.where(keep, per, np.float32(0.0))


def gather_column(column: pa.Array | pa.ChunkedArray, completion_off_N1: np.ndarray, rows: MergedRows) -> pa.ListArray:
    """A completion-aligned list column of the turns (``completion_logprobs``, ``completion_mask``, ``topk_ids``,
    ``ref_logprobs``, …; one list per turn, null or of the completion's length) as the merged rows' column: one list
    per row over its region, null where the position is not a sampled token or the turn's list is null. One take."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets -= offsets[0]
    src = rows.source_M
    sampled = src >= 0
    turn = np.searchsorted(completion_off_N1, np.where(sampled, src, 0), side="right") - 1
    pos = src - completion_off_N1[turn]
    present = column.is_valid().to_numpy(zero_copy_only=False)[turn] & (pos < np.diff(offsets)[turn])
    keep = sampled & present
    index = pa.array(np.where(keep, offsets[turn] + pos, 0), pa.int64(), mask=~keep)
    return pa.ListArray.from_arrays(pa.array(rows.region_off_R1, pa.int32()), values.take(index))


def plan_units(plan: pl.DataFrame, reward_mode: str = "last") -> pl.DataFrame:
    """Which turns ship as one merged row, decided without tokens (for the build's plan).

    ``plan``: one row per candidate turn with ``row`` (the scan row), ``kept`` (bool: it passed every filter),
    ``prefix_status`` (from ``prl check-tokens``: CLEAN / REALIGN / FORK / null), ``sample_id``, ``group_id``,
    ``score``, ``prompt_len``, ``completion_len``, the order keys of :data:`prl.trajectory.KEY_COLUMNS` and
    the sampling settings it has (:data:`prl.shards.merge_sampling.SAMPLING_SETTINGS`).
    A kept turn continues the row of the turn before it in its trajectory when that turn is kept too, its own
    status is CLEAN or REALIGN and its sampling settings equal the predecessor's; anything else (a FORK, an
    unchecked turn, a dropped or already shipped predecessor, other settings) starts a row. Returns one row per merged row: ``unit`` (int64), its first turn's ``sample_id``,
    ``group_id`` and ``prompt_len``, ``score`` combined over its turns (``reward_mode``), ``completion_len`` (its
    tokens after the first prompt: the last turn's prompt + completion minus the first prompt), ``turn_rows``
    (list of the turns' ``row``, in order) and ``turns``."""
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"reward mode must be one of {', '.join(REWARD_MODES)}, not {reward_mode!r}")
    order = trajectory_order(plan.select(*KEY_COLUMNS, "prompt_len"))
    df = plan[order.get_column("row").to_numpy()].with_columns(order.get_column("trajectory"))
    df = df.with_columns(settings_change(df))
    joins = (
        pl.col("kept")
        & pl.col("kept").shift(1).fill_null(False)
        & (pl.col("trajectory") == pl.col("trajectory").shift(1)).fill_null(False)
        & pl.col("prefix_status").is_in([CLEAN, REALIGN]).fill_null(False)
        & ~pl.col("settings_change")
    )
    df = df.with_columns((~joins).cum_sum().cast(pl.Int64).alias("unit")).filter(pl.col("kept"))
    combined = {"last": pl.col("score").last(), "sum": pl.col("score").sum(), "mean": pl.col("score").mean()}
    return (
        df.group_by("unit", maintain_order=True)
        .agg(
            pl.col("sample_id").first(),
            pl.col("group_id").first(),
            combined[reward_mode].alias("score"),
            pl.col("prompt_len").first(),
            (pl.col("prompt_len").last() + pl.col("completion_len").last() - pl.col("prompt_len").first()).alias(
                "completion_len"
            ),
            pl.col("row").alias("turn_rows"),
            pl.len().cast(pl.Int64).alias("turns"),
        )
        .sort("unit")
    )
