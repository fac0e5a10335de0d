"""``prefix`` check (token-in/token-out): within a session, the previous turn's prompt + completion must be a
bit-exact prefix of this turn's prompt.

Status per multi-turn sample (null for a session's first turn and for samples without a session):

- ``CLEAN``: the previous sequence is a prefix of this prompt.
- ``REALIGN`` (reason ``prefix_realign``, warn): the first difference lies in the last ``realign_window``
  tokens of the previous completion, e.g. a re-rendered end-of-turn; a trainer can splice the turns after
  trimming.
- ``FORK`` (reason ``prefix_fork``, drift): the history was re-rendered or edited earlier (re-serialized tool
  calls, stripped reasoning, truncation): a new trajectory starts here.

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
) -> tuple[Findings, list[str | None]]:
    """``previous_R[r]``: sample_ids of the previous step of row r's session (None: no previous step);
    ``sequences``: sample_id → (prompt + completion IDs, prompt length). Returns findings and status per
    row."""
    out = Findings()
    status: list[str | None] = [None] * batch.rows
    for r, candidates in enumerate(previous_R):
        if not candidates:
            continue
        prompt = batch.prompt.row(r)
        best: tuple[str, int, str, np.ndarray] | None = None
        for sid in candidates:
            if sid not in sequences:
                continue
            seq, plen = sequences[sid]
            st, at = classify_prefix(seq, plen, prompt, window)
            key_at = len(seq) if st == CLEAN else at
            if best is None or key_at > (len(best[3]) if best[0] == CLEAN else best[1]):
                best = (st, at, sid, seq)
        if best is None:
            continue
        st, at, sid, seq = best
        status[r] = st
        if st == CLEAN:
            continue
        start = max(0, at - WINDOW_BEFORE)
        out.add_one(
            r,
            "prefix_realign" if st == REALIGN else "prefix_fork",
            at,
            {
                "where": "prompt",
                "previous_sample_id": sid,
                "previous_len": len(seq),
                "window_start": start,
                "ids": prompt[start : at + WINDOW_AFTER].tolist(),
                "previous": seq[start : at + WINDOW_AFTER].tolist(),
            },
        )
    return out, status
