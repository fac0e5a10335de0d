"""``prefix`` check (token-in/token-out): within a trajectory (session, agent), the previous turn's prompt +
completion must be a bit-exact prefix of this turn's prompt. Each agent of a session is its own trajectory, so
interleaved agents are never compared with each other (order and trajectories: :mod:`prl.checks.history`).

Status per multi-turn sample (null for a trajectory's first turn and for samples without a session):

- ``CLEAN``: the previous sequence is a prefix of this prompt.
- ``REALIGN`` (reason ``prefix_realign``, warn): the first difference lies in the last ``realign_window``
  tokens of the previous completion, e.g. a re-rendered end-of-turn; a trainer can splice the turns after
  trimming.
- ``FORK`` (reason ``prefix_fork``, drift): the history was re-rendered or edited earlier (re-serialized tool
  calls, stripped reasoning, truncation): a new trajectory starts here.

A sample whose predecessor cannot be determined gets no status and reason ``prefix_unordered`` (warn), with why
in its evidence (:data:`prl.checks.history.UNDETERMINED`): it is counted, never skipped silently.

The position is the first differing position of this turn's prompt. When the previous step holds several
samples (n > 1 choices), the one sharing the longest prefix is the previous turn. This follows slime
``agent/trajectory.py`` and tinker-cookbook ``rl/data_processing.trajectory_to_data``, which start a new datum
when the extension property breaks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.history import PREVIOUS_MISSING, UNDETERMINED

CLEAN, REALIGN, FORK = "CLEAN", "REALIGN", "FORK"
WINDOW_BEFORE = 3
WINDOW_AFTER = 6


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


def check_prefix(
    batch: TokenBatch,
    previous_R: Sequence[Sequence[str] | None],
    sequences: Mapping[str, tuple[np.ndarray, int]],
    window: int,
    undetermined_R: Sequence[str | None] | None = None,
) -> tuple[Findings, list[str | None]]:
    """``previous_R[r]``: sample_ids of the previous step of row r's trajectory (None: no previous step);
    ``sequences``: sample_id → (prompt + completion IDs, prompt length); ``undetermined_R[r]``: why row r's
    predecessor cannot be determined (None: it can). Returns findings and status per row."""
    out = Findings()
    status: list[str | None] = [None] * batch.rows
    for r, candidates in enumerate(previous_R):
        why = undetermined_R[r] if undetermined_R is not None else None
        if why is None and not candidates:
            continue
        best = _best_previous(batch.prompt.row(r), candidates or (), sequences, window)
        if why is None and best is None:
            why = PREVIOUS_MISSING
        if why is not None:
            out.add_one(r, "prefix_unordered", -1, {"where": "prompt", "why": why, "meaning": UNDETERMINED[why]})
            continue
        assert best is not None
        st, at, sid, seq = best
        status[r] = st
        if st != CLEAN:
            out.add_one(r, "prefix_realign" if st == REALIGN else "prefix_fork", at, _evidence(batch, r, at, sid, seq))
    return out, status


def _best_previous(
    prompt: np.ndarray, candidates: Sequence[str], sequences: Mapping[str, tuple[np.ndarray, int]], window: int
) -> tuple[str, int, str, np.ndarray] | None:
    """(status, position, sample_id, sequence) of the candidate sharing the longest prefix with ``prompt``."""
    best: tuple[str, int, str, np.ndarray] | None = None
    for sid in candidates:
        if sid not in sequences:
            continue
        seq, plen = sequences[sid]
        st, at = classify_prefix(seq, plen, prompt, window)
        key_at = len(seq) if st == CLEAN else at
        if best is None or key_at > (len(best[3]) if best[0] == CLEAN else best[1]):
            best = (st, at, sid, seq)
    return best


def _evidence(batch: TokenBatch, r: int, at: int, sid: str, seq: np.ndarray) -> dict:
    prompt = batch.prompt.row(r)
    start = max(0, at - WINDOW_BEFORE)
    return {
        "where": "prompt",
        "previous_sample_id": sid,
        "previous_len": len(seq),
        "window_start": start,
        "ids": prompt[start : at + WINDOW_AFTER].tolist(),
        "previous": seq[start : at + WINDOW_AFTER].tolist(),
    }
