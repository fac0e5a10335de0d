"""``roundtrip`` check: ``encode(decode(ids)) == ids`` over prompt + completion, no special tokens added
and none skipped.

Shared work is done once. The tokenizer splits text at added tokens (``<｜User｜>``, ``<｜Assistant｜>``,
EOS…) before pre-tokenization, so the text between two of them is tokenized independently of everything
else: each sequence is cut at those tokens into *segments*, and a segment's result is cached by a digest of
its IDs. A system prompt shared by a thousand samples, a group's prompt, or a multi-turn history repeated in
every later turn is decoded and encoded once; only new segments reach the tokenizer.

Reasons (positions are prompt or completion positions, by reason):

- ``roundtrip_prompt`` / ``roundtrip_completion`` (drift): the re-encoded IDs differ first at that position.
- ``roundtrip_partial_char`` (warn): the only difference is a UTF-8 character cut at the very end of the
  sequence (a completion stopped mid-character), which decodes to U+FFFD.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

import numpy as np

from prl.checks.arrays import Ragged
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.tokenizer import CheckTokenizer

WINDOW_BEFORE = 3
WINDOW_AFTER = 6


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
class RoundTripper:
    """Round-trip checker with a segment cache of at most ``max_entries`` digests."""

    tok: CheckTokenizer
    max_entries: int = 1 << 19
    cache: dict[bytes, SegmentFailure | None] = field(default_factory=dict)
    stats: RoundTripStats = field(default_factory=RoundTripStats)

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
        """Round-trip rows ``use_R`` of ``seq``. Returns, for each failing row, (first divergent sequence
        position, start of the failing segment, its failure)."""
        starts, ends = self.segments(seq, use_R)
        ids32 = seq.values.astype(np.int32)
        self.stats.tokens += int(seq.lengths[use_R].sum())
        self.stats.segments += len(starts)
        keys = [
            hashlib.blake2b(ids32[s:e].tobytes(), digest_size=16).digest()
            for s, e in zip(starts.tolist(), ends.tolist(), strict=False)
        ]
        todo: dict[bytes, tuple[int, int]] = {}
        for key, s, e in zip(keys, starts.tolist(), ends.tolist(), strict=False):
            if key not in self.cache and key not in todo:
                todo[key] = (s, e)
        if todo:
            self._run(todo, ids32)
        out: dict[int, tuple[int, int, SegmentFailure]] = {}
        row_of_start = np.searchsorted(seq.offsets, starts, side="right") - 1
        for i, key in enumerate(keys):
            failure = self.cache.get(key)
            if failure is None:
                continue
            row = int(row_of_start[i])
            if row not in out:
                s = int(starts[i])
                out[row] = (s - int(seq.offsets[row]) + failure.at, s, failure)
        return out

    def _run(self, todo: dict[bytes, tuple[int, int]], ids32: np.ndarray) -> None:
        spans = list(todo.values())
        originals = [ids32[s:e].tolist() for s, e in spans]
        self.stats.segments_encoded += len(spans)
        self.stats.tokens_encoded += sum(e - s for s, e in spans)
        texts = self.tok.decode_batch(originals)
        encoded = self.tok.encode_batch(texts)
        if len(self.cache) + len(todo) > self.max_entries:
            for old in list(itertools.islice(iter(self.cache), len(self.cache) // 2 + len(todo))):
                del self.cache[old]
        for key, orig, text, got in zip(todo, originals, texts, encoded, strict=False):
            if got == orig:
                self.cache[key] = None
                continue
            a = np.asarray(orig, dtype=np.int64)
            b = np.asarray(got, dtype=np.int64)
            m = min(len(a), len(b))
            diff = np.flatnonzero(a[:m] != b[:m])
            at = int(diff[0]) if len(diff) else m
            partial = False
            if text.endswith("\ufffd"):
                cut = self._complete_prefix(orig)
                if cut is not None:
                    at, partial = cut, True
            start = max(0, at - WINDOW_BEFORE)
            self.cache[key] = SegmentFailure(at, start, tuple(got[start : at + WINDOW_AFTER]), partial)

    def _complete_prefix(self, orig: list[int]) -> int | None:
        """When only a UTF-8 character cut at the end keeps ``orig`` from round-tripping: the length of the
        clean part before it (the cut character spans at most 4 byte tokens), else None."""
        for cut in range(len(orig) - 1, max(len(orig) - 5, -1), -1):
            head = orig[:cut]
            text = self.tok.decode_batch([head])[0] if head else ""
            if not text.endswith("\ufffd"):
                return cut if (not head or self.tok.encode_batch([text])[0] == head) else None
        return None


def check_roundtrip(batch: TokenBatch, seq: Ragged, use_R: np.ndarray, rt: RoundTripper) -> Findings:
    """Findings for rows ``use_R`` (rows with out-of-vocabulary IDs must be excluded by the caller)."""
    out = Findings()
    plen = batch.prompt.lengths
    for row, (pos, seg_start, failure) in sorted(rt.check_sequences(seq, use_R).items()):
        row_start = int(seq.offsets[row])
        row_end = int(seq.offsets[row + 1])
        at_end = failure.partial_tail and _segment_reaches(seq, seg_start, row_end, rt)
        where = "prompt" if pos < plen[row] else "completion"
        part_pos = pos if where == "prompt" else pos - int(plen[row])
        reason = "roundtrip_partial_char" if at_end else f"roundtrip_{where}"
        w0 = seg_start + failure.window_start
        original = seq.values[w0 : min(w0 + WINDOW_BEFORE + WINDOW_AFTER, row_end)].tolist()
        window_pos = w0 - row_start - (0 if where == "prompt" else int(plen[row]))
        out.add_one(
            row,
            reason,
            part_pos,
            {
                "where": where,
                "window_start": window_pos,
                "ids": original,
                "reencoded": list(failure.reencoded),
            },
        )
    return out


def _segment_reaches(seq: Ragged, seg_start: int, row_end: int, rt: RoundTripper) -> bool:
    """True when the segment starting at ``seg_start`` runs to its row's end (no boundary token after)."""
    tail = seq.values[seg_start:row_end]
    lut = rt.tok.boundary_lut
    return not bool(lut[np.clip(tail, 0, len(lut) - 1)].any())
