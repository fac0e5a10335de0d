"""``prefix`` check (token-in/token-out): within a trajectory (session, agent), the previous turn's prompt +
completion must be a bit-exact prefix of this turn's prompt. Each agent of a session is its own trajectory, so
interleaved agents are never compared with each other (order and trajectories: :mod:`prl.trajectory`).

Status per multi-turn sample (null for a trajectory's first turn and for samples without a session):

- ``CLEAN``: the previous sequence is a prefix of this prompt.
- ``REALIGN`` (reason ``prefix_realign``, warn): the first difference lies in the last ``realign_window``
  tokens of the previous completion, e.g. a re-rendered end-of-turn; a trainer can splice the turns after
  trimming.
- ``FORK`` (reason ``prefix_fork``, drift): the history was re-rendered or edited earlier (re-serialized tool
  calls, stripped reasoning, truncation): a new trajectory starts here.

A sample whose predecessor cannot be determined gets no status and reason ``prefix_unordered`` (warn), with why
in its evidence (:data:`prl.trajectory.UNDETERMINED`): it is counted, never skipped silently.

The position is the first differing position of this turn's prompt. When the previous step holds several
samples (n > 1 choices), the one sharing the longest prefix is the previous turn. This follows slime
``agent/trajectory.py`` and tinker-cookbook ``rl/data_processing.trajectory_to_data``, which start a new datum
when the extension property breaks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from prl.checks.arrays import Ragged
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.trajectory import CLEAN, FORK, PREVIOUS_MISSING, REALIGN, UNDETERMINED

WINDOW_BEFORE = 3
WINDOW_AFTER = 6


def check_prefix(
    batch: TokenBatch,
    previous_R: Sequence[Sequence[str] | None],
    sequences: Mapping[str, tuple[np.ndarray, int]],
    window: int,
    undetermined_R: Sequence[str | None] | None = None,
) -> tuple[Findings, list[str | None]]:
    """``previous_R[r]``: sample_ids of the previous step of row r's trajectory (None: no previous step);
    ``sequences``: sample_id → (prompt + completion IDs, prompt length); ``undetermined_R[r]``: why row r's
    predecessor cannot be determined (None: it can). Returns findings and status per row.

    Every (row, candidate) pair is compared at once (:func:`common_prefix_lengths`); Python per row only gathers
    the candidates and explains the rows that are not CLEAN."""
    status: list[str | None] = [None] * batch.rows
    found: list[tuple[int, str, int, dict]] = []
    pair_row: list[int] = []
    pair_sid: list[str] = []
    pair_seq: list[np.ndarray] = []
    pair_plen: list[int] = []
    for r, candidates in enumerate(previous_R):
        why = undetermined_R[r] if undetermined_R is not None else None
        if why is None and not candidates:
            continue
        placed = False
        if why is None:
            for sid in candidates or ():
                known = sequences.get(sid)
                if known is not None:
                    pair_row.append(r)
                    pair_sid.append(sid)
                    pair_seq.append(known[0])
                    pair_plen.append(known[1])
                    placed = True
            why = None if placed else PREVIOUS_MISSING
        if why is not None:
            found.append((r, "prefix_unordered", -1, {"where": "prompt", "why": why, "meaning": UNDETERMINED[why]}))
    if pair_row:
        rows_P = np.asarray(pair_row, dtype=np.int64)
        lens_P = np.fromiter(map(len, pair_seq), dtype=np.int64, count=len(pair_seq))
        at_P = common_prefix_lengths(pair_seq, lens_P, batch.prompt, rows_P)
        plen_P = np.asarray(pair_plen, dtype=np.int64)
        clean_P = at_P == lens_P
        realign_P = ~clean_P & (at_P >= plen_P) & (at_P >= lens_P - window)
        key_P = np.where(clean_P, lens_P, at_P)
        # the candidate sharing the longest prefix, the first one on ties: pairs sorted by row, key desc, order
        order = np.lexsort((np.arange(len(rows_P)), -key_P, rows_P))
        first = order[np.concatenate(([True], rows_P[order][1:] != rows_P[order][:-1]))]
        for p in first.tolist():
            r = pair_row[p]
            st = CLEAN if clean_P[p] else REALIGN if realign_P[p] else FORK
            status[r] = st
            if st != CLEAN:
                at = int(at_P[p])
                code = "prefix_realign" if st == REALIGN else "prefix_fork"
                found.append((r, code, at, _evidence(batch, r, at, pair_sid[p], pair_seq[p])))
    out = Findings()
    for r, code, at, evidence in sorted(found, key=lambda f: f[0]):
        out.add_one(r, code, at, evidence)
    return out, status


PAIR_TOKENS = 1 << 22
"""Token comparisons per step of :func:`common_prefix_lengths` (bounds its index arrays)."""


def common_prefix_lengths(
    seqs: list[np.ndarray], lens_P: np.ndarray, prompts: Ragged, rows_P: np.ndarray, budget: int = PAIR_TOKENS
) -> np.ndarray:
    """int64[P]: the longest common prefix of ``seqs[p]`` (of length ``lens_P[p]``) and prompt row ``rows_P[p]``,
    computed over the flattened pairs, at most ``budget`` compared tokens per step (one pair when it needs more)."""
    m_P = np.minimum(lens_P, prompts.lengths[rows_P])
    out = m_P.copy()
    ends = np.cumsum(m_P)
    start = 0
    while start < len(seqs):
        stop = max(start + 1, int(np.searchsorted(ends, (ends[start - 1] if start else 0) + budget, "right")))
        m = m_P[start:stop]
        total = int(m.sum())
        if total:
            pair = np.repeat(np.arange(start, stop, dtype=np.int64), m)
            pos = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
            prev = np.concatenate([seqs[p][: m_P[p]] for p in range(start, stop)])
            differs = np.flatnonzero(prev != prompts.values[prompts.offsets[rows_P[pair]] + pos])
            if len(differs):
                hit_pairs, first = np.unique(pair[differs], return_index=True)
                out[hit_pairs] = pos[differs[first]]
        start = stop
    return out


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
