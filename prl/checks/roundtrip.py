"""``roundtrip`` check: ``encode(decode(ids)) == ids`` over prompt + completion, no special tokens added
and none skipped.

Shared work is done once. The tokenizer splits text at added tokens (``<｜User｜>``, ``<｜Assistant｜>``,
EOS…) before pre-tokenization, so the text between two of them is tokenized independently of everything
else: each sequence is cut at those tokens into *segments*, and a segment's result is cached by a digest of
its IDs. A system prompt shared by a thousand samples, a group's prompt, or a multi-turn history repeated in
every later turn is decoded and encoded once; only new segments reach the tokenizer.

Reasons (positions are prompt or completion positions, by reason):

- ``roundtrip_prompt`` (drift) / ``roundtrip_completion`` (note): the re-encoded IDs differ first at that
  position.
- ``roundtrip_boundary`` (note): they differ first in the prompt, inside a segment that runs on into the
  completion, and the prompt's part of it round-trips alone: the prompt's text and the sampled text merge
  across the boundary (``"." + "skin"`` re-encodes as ``".s" + "kin"``), which says nothing against the prompt.
- ``roundtrip_partial_char`` (note): the only difference is a UTF-8 character cut at the very end of the
  sequence (a completion stopped mid-character), which decodes to U+FFFD.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from prl.checks.arrays import Ragged
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.joined import Joiner, joined_round_trip
from prl.checks.tokenizer import CheckTokenizer

WINDOW_BEFORE = 3
WINDOW_AFTER = 6
COMPARE_STEP = 1 << 20
"""Tokens compared at once when re-encodings are checked against their segments (bounds the temporaries)."""


@dataclass(frozen=True)
class SegmentFailure:
    """Where a segment's re-encoding first differs (``at``, a segment position) and the re-encoded IDs from
    ``window_start`` on (a few tokens), for showing."""

    at: int
    window_start: int
    reencoded: tuple[int, ...]
    partial_tail: bool


@dataclass
class RoundTripStats:
    tokens: int = 0
    """Tokens of all sequences checked."""
    tokens_encoded: int = 0
    """Tokens that went through decode + encode (the rest were answered from the cache)."""
    segments: int = 0
    segments_encoded: int = 0


@dataclass
class _Job:
    """The decode + encode of one batch's new segments (their digests ``keys``), on the tokenizer thread or
    done at once; its outcomes go into the cache when the batch that started it is finished."""

    keys: list[bytes]
    future: Future[list[SegmentFailure | None]]
    outcomes: dict[bytes, SegmentFailure | None] | None = None


@dataclass
class PendingSegments:
    """A batch's round trip between :meth:`RoundTripper.submit` and :meth:`RoundTripper.finish`: each segment's
    start (a value index of the sequences) and digest, the outcomes the cache held when it was submitted, and the
    jobs (its own and earlier batches' still running) that hold the others."""

    offsets: np.ndarray
    starts: np.ndarray
    keys: list[bytes]
    known: dict[bytes, SegmentFailure | None]
    jobs: list[_Job]


@dataclass
class RoundTripper:
    """Round-trip checker with a segment cache of at most ``max_entries`` digests. With ``background`` the
    tokenizer calls of a submitted batch run on one thread of their own (the Rust calls release the GIL and use
    every core), so that the caller prepares and assembles other batches meanwhile; :meth:`close` ends it."""

    tok: CheckTokenizer
    max_entries: int = 1 << 19
    background: bool = False
    joined: bool = True
    """Join segments into a few tokenizer calls when the tokenizer allows (False: one list per segment)."""
    cache: dict[bytes, SegmentFailure | None] = field(default_factory=dict)
    stats: RoundTripStats = field(default_factory=RoundTripStats)
    _inflight: dict[bytes, _Job] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = None

    @cached_property
    def joiner(self) -> Joiner | None:
        """How segments are joined into a few calls, None for one call per segment."""
        return Joiner.of(self.tok) if self.joined else None

    def segments(self, seq: Ragged, use_R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (exclusive) value indices of the maximal boundary-free runs inside rows ``use_R``."""
        vals = seq.values
        n = len(vals)
        if n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        lut = self.tok.boundary_lut
        bnd_T = lut[np.clip(vals, 0, len(lut) - 1)] | ~use_R[seq.row_of]
        nonempty = seq.lengths > 0
        row_start_T = np.zeros(n, dtype=bool)
        row_start_T[seq.offsets[:-1][nonempty]] = True
        row_end_T = np.zeros(n, dtype=bool)
        row_end_T[seq.offsets[1:][nonempty] - 1] = True
        prev_bnd = np.concatenate(([True], bnd_T[:-1])) | row_start_T
        next_bnd = np.concatenate((bnd_T[1:], [True])) | row_end_T
        inner = ~bnd_T
        return np.flatnonzero(inner & prev_bnd), np.flatnonzero(inner & next_bnd) + 1

    def check_sequences(self, seq: Ragged, use_R: np.ndarray) -> dict[int, tuple[int, int, SegmentFailure]]:
        """Round-trip rows ``use_R`` of ``seq``: :meth:`submit` then :meth:`finish`."""
        return self.finish(self.submit(seq, use_R))

    def submit(self, seq: Ragged, use_R: np.ndarray) -> PendingSegments:
        """Cut rows ``use_R`` of ``seq`` into segments and start the decode + encode of those that neither the
        cache nor a running job answers (each distinct segment once)."""
        starts, ends = self.segments(seq, use_R)
        ids32 = seq.values.astype(np.int32)
        self.stats.tokens += int(seq.lengths[use_R].sum())
        self.stats.segments += len(starts)
        raw = ids32.tobytes()
        bounds = list(zip((4 * starts).tolist(), (4 * ends).tolist(), strict=True))
        keys = [hashlib.blake2b(raw[s:e], digest_size=16).digest() for s, e in bounds]
        cache, inflight = self.cache, self._inflight
        first = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))  # key → its first segment
        new = first.keys() - cache.keys()
        known = {key: cache[key] for key in first.keys() - new}
        waiting = new & inflight.keys()
        jobs = {id(job): job for job in map(inflight.__getitem__, waiting)}
        todo = {key: first[key] for key in sorted(new - waiting, key=first.__getitem__)}
        if todo:
            job = self._start(todo, ids32, starts, ends)
            jobs[id(job)] = job
        return PendingSegments(seq.offsets, starts, keys, known, list(jobs.values()))

    def finish(self, pending: PendingSegments) -> dict[int, tuple[int, int, SegmentFailure]]:
        """Wait for a submitted batch's jobs. Returns, for each failing row, (first divergent sequence position,
        start of the failing segment, its failure)."""
        outcome = pending.known
        for job in pending.jobs:
            outcome.update(self._merge(job))
        keys, starts = pending.keys, pending.starts
        out: dict[int, tuple[int, int, SegmentFailure]] = {}
        failing = [i for i, key in enumerate(keys) if outcome[key] is not None]
        if not failing:
            return out
        offsets = pending.offsets
        row_of_start = (np.searchsorted(offsets, starts[failing], side="right") - 1).tolist()
        for i, row in zip(failing, row_of_start, strict=True):
            if row not in out:
                failure = outcome[keys[i]]
                assert failure is not None
                s = int(starts[i])
                out[row] = (s - int(offsets[row]) + failure.at, s, failure)
        return out

    def close(self) -> None:
        """End the tokenizer thread (a later :meth:`submit` starts a new one): the job it runs finishes, jobs not
        started are cancelled (a run ending on an error does not wait for the batches queued ahead)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            for key, job in list(self._inflight.items()):
                if job.future.cancelled():
                    del self._inflight[key]

    def _start(self, todo: dict[bytes, int], ids32: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> _Job:
        """A job for the segments ``todo`` names (key → segment index), running or done."""
        picked = np.fromiter(todo.values(), dtype=np.int64, count=len(todo))
        s_N, e_N = starts[picked], ends[picked]
        self.stats.segments_encoded += len(picked)
        self.stats.tokens_encoded += int((e_N - s_N).sum())
        future: Future[list[SegmentFailure | None]]
        if self.background:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prl-roundtrip")
            future = self._pool.submit(self._outcomes, ids32, s_N, e_N)
        else:
            future = Future()
            future.set_result(self._outcomes(ids32, s_N, e_N))
        job = _Job(list(todo), future)
        self._inflight.update(dict.fromkeys(job.keys, job))
        return job

    def _merge(self, job: _Job) -> dict[bytes, SegmentFailure | None]:
        """A job's outcomes by key, put into the cache (oldest entries out first) when first asked for."""
        if job.outcomes is not None:
            return job.outcomes
        try:
            results = job.future.result()
        except BaseException:  # a failed job answers no later batch: its keys are computed again if asked
            for key in job.keys:
                if self._inflight.get(key) is job:
                    del self._inflight[key]
            raise
        job.outcomes = dict(zip(job.keys, results, strict=True))
        cache = self.cache
        if len(cache) + len(job.keys) > self.max_entries:
            for old in list(itertools.islice(iter(cache), len(cache) // 2 + len(job.keys))):
                del cache[old]
        cache.update(job.outcomes)
        deque(map(self._inflight.pop, job.keys), maxlen=0)  # a key is in flight in one job only
        return job.outcomes

    def _outcomes(self, ids32: np.ndarray, s_N: np.ndarray, e_N: np.ndarray) -> list[SegmentFailure | None]:
        """Decode + encode segments ``ids32[s_N[i]:e_N[i]]``: None for each that round-trips, else its failure."""
        texts, enc_vals, enc_start, enc_len = self._round_trip(ids32, s_N, e_N)
        orig_len = e_N - s_N
        at_N = _first_difference(ids32, s_N, orig_len, enc_vals, enc_start, enc_len)
        outcomes: list[SegmentFailure | None] = [None] * len(s_N)
        bad = np.flatnonzero((at_N < orig_len) | (enc_len != orig_len)).tolist()
        if not bad:
            return outcomes
        partial = [i for i in bad if texts[i].endswith("\ufffd")]
        heads = [ids32[s_N[i] : e_N[i]].tolist() for i in partial]
        cuts = dict(zip(partial, self._complete_prefixes(heads), strict=True))
        for i, at in zip(bad, at_N[bad].tolist(), strict=True):
            cut = cuts.get(i)
            if cut is not None:
                at = cut
            start = max(0, at - WINDOW_BEFORE)
            e0 = int(enc_start[i])
            window = enc_vals[e0 + start : e0 + min(int(enc_len[i]), at + WINDOW_AFTER)]
            outcomes[i] = SegmentFailure(at, start, tuple(window.tolist()), cut is not None)
        return outcomes

    def _round_trip(
        self, ids32: np.ndarray, s_N: np.ndarray, e_N: np.ndarray
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """The texts of segments ``ids32[s_N[i]:e_N[i]]`` and their re-encodings (int64 values, each segment's
        start and length in them): joined into a few calls when the tokenizer allows (:mod:`prl.checks.joined`),
        else one list per segment."""
        if self.joiner is not None:
            return joined_round_trip(self.tok, self.joiner, ids32, s_N, e_N)
        flat = ids32.tolist()
        texts = self.tok.decode_batch([flat[s:e] for s, e in zip(s_N.tolist(), e_N.tolist(), strict=True)])
        encoded = self.tok.encode_batch(texts)
        enc_len = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        enc_vals = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(enc_len.sum()))
        enc_start = np.zeros(len(encoded), np.int64)
        np.cumsum(enc_len[:-1], out=enc_start[1:])
        return texts, enc_vals, enc_start, enc_len

    def _complete_prefixes(self, originals: list[list[int]]) -> list[int | None]:
        """For each segment whose text ends in a cut character: when only a UTF-8 character cut at the end keeps
        it from round-tripping, the length of the clean part before it (the cut character spans at most 4 byte
        tokens), else None. The longest head whose text does not end in U+FFFD is the clean part; it must
        round-trip itself. One decode and one encode call for all segments."""
        heads = [
            (n, orig[:cut])
            for n, orig in enumerate(originals)
            for cut in range(len(orig) - 1, max(len(orig) - 5, -1), -1)
        ]
        texts = self.tok.decode_batch([h for _, h in heads if h]) if heads else []
        decoded = iter(texts)
        clean: dict[int, tuple[list[int], str]] = {}
        for n, head in heads:
            text = next(decoded) if head else ""
            if n not in clean and not text.endswith("\ufffd"):
                clean[n] = (head, text)
        found = [(n, head, text) for n, (head, text) in clean.items() if head]
        encoded = self.tok.encode_batch([text for _, _, text in found]) if found else []
        ok = {n for (n, head, _), got in zip(found, encoded, strict=True) if got == head}
        return [
            (len(clean[n][0]) if (not clean[n][0] or n in ok) else None) if n in clean else None
            for n in range(len(originals))
        ]


def _first_difference(
    va: np.ndarray, off_a: np.ndarray, la: np.ndarray, vb: np.ndarray, off_b: np.ndarray, lb: np.ndarray
) -> np.ndarray:
    """int64[N]: the first position where ``va[off_a[i]:][:la[i]]`` and ``vb[off_b[i]:][:lb[i]]`` differ (the
    shorter length when one is a prefix of the other), compared in steps of about ``COMPARE_STEP`` tokens."""
    m = np.minimum(la, lb)
    out = m.copy()
    ends = np.cumsum(m)
    lo = 0
    while lo < len(m):
        hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + COMPARE_STEP, side="right")))
        mm = m[lo:hi]
        row = np.repeat(np.arange(lo, hi), mm)
        pos = np.arange(int(mm.sum())) - np.repeat(np.cumsum(mm) - mm, mm)
        differs = va[off_a[row] + pos] != vb[off_b[row] + pos]
        hits = np.flatnonzero(differs)
        if len(hits):
            uniq, first = np.unique(row[hits], return_index=True)
            out[uniq] = pos[hits[first]]
        lo = hi
    return out


def roundtrip_findings(
    batch: TokenBatch, seq: Ragged, failures: dict[int, tuple[int, int, SegmentFailure]], rt: RoundTripper
) -> Findings:
    """Findings for the failing rows :meth:`RoundTripper.finish` gave for ``seq`` (``batch``'s sequences)."""
    out = Findings()
    if not failures:
        return out
    plen = batch.prompt.lengths.tolist()
    offsets = seq.offsets.tolist()
    values = seq.values.tolist()
    boundary = _boundary_merges(seq, failures, plen, rt)
    for row, (pos, seg_start, failure) in sorted(failures.items()):
        row_start, row_end = offsets[row], offsets[row + 1]
        at_end = failure.partial_tail and _segment_reaches(seq, seg_start, row_end, rt)
        in_prompt = pos < plen[row]
        where = "prompt" if in_prompt else "completion"
        shift = 0 if in_prompt else plen[row]
        if at_end:
            reason = "roundtrip_partial_char"
        elif row in boundary:
            reason = "roundtrip_boundary"
        else:
            reason = f"roundtrip_{where}"
        w0 = seg_start + failure.window_start
        out.add_one(
            row,
            reason,
            pos - shift,
            {
                "where": where,
                "window_start": w0 - row_start - shift,
                "ids": values[w0 : min(w0 + WINDOW_BEFORE + WINDOW_AFTER, row_end)],
                "reencoded": list(failure.reencoded),
            },
        )
    return out


def _boundary_merges(
    seq: Ragged, failures: dict[int, tuple[int, int, SegmentFailure]], plen: list[int], rt: RoundTripper
) -> set[int]:
    """The failing rows whose first difference lies in a segment that runs from the prompt on into the
    completion (no boundary token between its start and the prompt's end, and a completion after it) while
    the prompt's part of that segment round-trips alone: one decode and one encode call for all of them."""
    lut = rt.tok.boundary_lut
    offsets = seq.offsets
    candidates: list[tuple[int, list[int]]] = []
    for row, (pos, seg_start, _failure) in failures.items():
        row_start, row_end = int(offsets[row]), int(offsets[row + 1])
        prompt_end = row_start + plen[row]
        if pos >= plen[row] or prompt_end >= row_end or seg_start >= prompt_end:
            continue
        head = seq.values[seg_start:prompt_end]
        if lut[np.clip(head, 0, len(lut) - 1)].any() or lut[min(max(int(seq.values[prompt_end]), 0), len(lut) - 1)]:
            continue  # the segment ends inside the prompt, or the completion starts with a boundary token
        candidates.append((row, head.tolist()))
    if not candidates:
        return set()
    texts = rt.tok.decode_batch([head for _, head in candidates])
    encoded = rt.tok.encode_batch(texts)
    return {row for (row, head), again in zip(candidates, encoded, strict=True) if list(again) == head}


def _segment_reaches(seq: Ragged, seg_start: int, row_end: int, rt: RoundTripper) -> bool:
    """True when the segment starting at ``seg_start`` runs to its row's end (no boundary token after)."""
    tail = seq.values[seg_start:row_end]
    lut = rt.tok.boundary_lut
    return not bool(lut[np.clip(tail, 0, len(lut) - 1)].any())
