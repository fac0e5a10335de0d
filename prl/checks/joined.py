"""Round-trip texts and re-encodings of many segments in a few tokenizer calls.

A tokenizer call per segment costs a Python object per segment both ways (the ID lists in, the ``Encoding``
objects out) and most of the calls' time on short segments. Instead, the segments of a batch are joined into a
few sequences, each segment followed by a *separator*: an added token that the tokenizer splits out before
normalization and pre-tokenization (the first added token :meth:`Joiner.of` finds fit). For a byte-level
tokenizer with no normalizer and a pre-tokenizer that splits each piece on its own (:data:`LOCAL_PRE_TOKENIZERS`)
this gives exactly the per-segment results:

- decoding concatenates the tokens' bytes and replaces invalid UTF-8 by maximal subparts, so with a separator
  that starts and ends with an ASCII character the text of a joined sequence is each segment's text followed by
  the separator's; it is split back at the separator, and a sequence whose split does not give one text per
  segment (a segment's text spells the separator) is decoded segment by segment;
- the text between two added tokens is encoded independently of everything around it, and added tokens are
  matched leftmost-longest. A segment text holding no character that starts an added token cannot start or hold
  an added-token match, and no added token extends the separator, so each such text, followed by the
  separator, is encoded as it is alone, followed by the separator's ID. Texts holding such a character (and any
  joined sequence whose separators do not come back where they were put) are encoded one by one.

Tokenizers outside these conditions (another decoder, a normalizer, a pre-tokenizer that looks beyond a piece
such as ``Metaspace``'s first-piece prefix, truncation or padding, no such separator, or probe texts whose joined
encoding is not their encodings one by one) get no :class:`Joiner` and are called segment by segment.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import numpy as np

from prl.checks.tokenizer import CheckTokenizer

NO_NORMALIZER = {"type": "Sequence", "normalizers": []}
"""A normalizer that changes nothing (as DeepSeek-V4's tokenizer.json has it)."""
LOCAL_PRE_TOKENIZERS = frozenset({"Split", "ByteLevel", "Digits", "Punctuation"})
"""Pre-tokenizers (alone or in a ``Sequence``) that split each piece between added tokens by its own text only."""
PROBES = ("a", " a", "a ", "12345", "x\n\ny", "  ", "\u00e9t\u00e9", "A.b")
"""Texts whose joined encoding must equal their encodings one by one before a tokenizer gets a joiner."""
SEGMENTS_PER_CALL = 64
"""Segments joined into one sequence (a batch of 4,096 segments makes 64 sequences, enough for the tokenizer to
spread over its threads)."""


@dataclass(frozen=True)
class Joiner:
    """The separator (its ID and text) and the characters that start an added token."""

    sep_id: int
    sep_text: str
    starts: tuple[str, ...]

    @classmethod
    def of(cls, tok: CheckTokenizer) -> Joiner | None:
        """The joiner of ``tok``, or None when its results could differ from per-segment calls."""
        t = tok.tokenizer
        if t.truncation is not None or t.padding is not None:
            return None
        if t.decoder is None or json.loads(t.decoder.__getstate__()).get("type") != "ByteLevel":
            return None
        if t.normalizer is not None and json.loads(t.normalizer.__getstate__()) != NO_NORMALIZER:
            return None
        if t.pre_tokenizer is not None and not _local(json.loads(t.pre_tokenizer.__getstate__())):
            return None
        added = t.get_added_tokens_decoder()
        contents = [a.content for a in added.values()]
        if not contents or any(not c for c in contents):
            return None
        for i in sorted(added):
            a = added[i]
            c = a.content
            if a.lstrip or a.rstrip or a.single_word or a.normalized or not (c[0].isascii() and c[-1].isascii()):
                continue
            if any(o != c and o.startswith(c) for o in contents) or any(c[:k] == c[-k:] for k in range(1, len(c))):
                continue
            if tok.decode_batch([[i]]) == [c] and tok.encode_batch([c]) == [[i]]:
                joiner = cls(i, c, tuple(sorted({o[0] for o in contents})))
                return joiner if _probes_agree(tok, joiner) else None
        return None

    def safe(self, text: str) -> bool:
        """True when ``text`` holds no character that starts an added token."""
        return not any(ch in text for ch in self.starts)


def _local(state: dict) -> bool:
    """Whether a pre-tokenizer's state is made only of :data:`LOCAL_PRE_TOKENIZERS`."""
    if state.get("type") == "Sequence":
        return all(_local(part) for part in state.get("pretokenizers", []))
    return state.get("type") in LOCAL_PRE_TOKENIZERS


def _probes_agree(tok: CheckTokenizer, joiner: Joiner) -> bool:
    """Whether :data:`PROBES` joined by the separator encode as each probe alone, followed by the separator."""
    alone = tok.encode_batch(list(PROBES))
    (joined,) = tok.encode_batch(["".join(p + joiner.sep_text for p in PROBES)])
    return joined == [i for ids in alone for i in (*ids, joiner.sep_id)]


def joined_round_trip(
    tok: CheckTokenizer, joiner: Joiner, ids32: np.ndarray, s_N: np.ndarray, e_N: np.ndarray
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Decode segments ``ids32[s_N[i]:e_N[i]]`` and encode their texts. Returns the ``N`` texts and the
    re-encodings as int64 values with each segment's start and length in them."""
    n = len(s_N)
    lens = (e_N - s_N).astype(np.int64)
    out_start = np.zeros(n, np.int64)
    np.cumsum(lens[:-1] + 1, out=out_start[1:])
    total = int(lens.sum())
    joined = np.full(total + n, joiner.sep_id, np.int64)
    rep = np.repeat(np.arange(n), lens)
    k = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
    joined[out_start[rep] + k] = ids32[s_N[rep] + k]
    spans = list(itertools.pairwise([*range(0, n, SEGMENTS_PER_CALL), n]))
    ends = np.append(out_start, total + n)
    chunks = [joined[ends[a] : ends[b]].tolist() for a, b in spans]
    texts: list[str] = []
    for (a, b), text in zip(spans, tok.decode_batch(chunks), strict=True):
        pieces = text.split(joiner.sep_text)
        if len(pieces) == b - a + 1 and pieces[-1] == "":
            texts.extend(pieces[:-1])
        else:  # a segment's text spells the separator: this sequence's segments one by one
            alone = zip(s_N[a:b].tolist(), e_N[a:b].tolist(), strict=True)
            texts.extend(tok.decode_batch([ids32[s:e].tolist() for s, e in alone]))
    return texts, *_encodings(tok, joiner, texts)


def _encodings(tok: CheckTokenizer, joiner: Joiner, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The re-encodings of ``texts``: int64 values, each text's start and length in them."""
    n = len(texts)
    safe = [joiner.safe(t) for t in texts]
    joined_idx = [i for i in range(n) if safe[i]]
    groups = [joined_idx[a : a + SEGMENTS_PER_CALL] for a in range(0, len(joined_idx), SEGMENTS_PER_CALL)]
    sep, sep_text = joiner.sep_id, joiner.sep_text
    encoded = tok.encode_batch(["".join(texts[i] + sep_text for i in g) for g in groups])
    start = np.zeros(n, np.int64)
    length = np.zeros(n, np.int64)
    parts: list[np.ndarray] = []
    at = 0
    alone = [i for i in range(n) if not safe[i]]
    for g, ids in zip(groups, encoded, strict=True):
        arr = np.asarray(ids, dtype=np.int64)
        seps = np.flatnonzero(arr == sep)
        if len(seps) != len(g) or (len(arr) and arr[-1] != sep):
            alone.extend(g)  # separators not where they were put: these texts one by one
            continue
        piece_start = np.concatenate(([0], seps[:-1] + 1))
        start[g] = at + piece_start
        length[g] = seps - piece_start
        parts.append(arr)
        at += len(arr)
    if alone:
        for i, ids in zip(alone, tok.encode_batch([texts[i] for i in alone]), strict=True):
            start[i], length[i] = at, len(ids)
            parts.append(np.asarray(ids, dtype=np.int64))
            at += len(ids)
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return values, start, length
