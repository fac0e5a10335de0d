"""Segments joined into a few tokenizer calls give exactly the per-segment round trips: random token IDs (text
of every script, cut characters), added tokens inside segments, texts that spell an added token or the
separator itself, with the real DeepSeek-V4 tokenizer and Qwen's tiktoken vocabulary."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from tokenizers import normalizers, pre_tokenizers

from prl.checks import CheckTokenizer
from prl.checks.joined import Joiner
from prl.checks.roundtrip import RoundTripper
from tests.checks_helpers import enc, tokenizer_dir
from tests.test_formats_tiktoken import qwen3  # noqa: F401  (fixture)


def _segments(
    tok: CheckTokenizer, spelled: list[list[int]], seed: int, rare: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """2,000 segments of 1-40 random IDs (no boundary tokens; some non-boundary added tokens), every tenth
    one holding a spelled-out added token, segments 100 and 1,500 holding ``rare``; flat int32 IDs with each
    segment's start and end."""
    rng = np.random.default_rng(seed)
    allowed = np.flatnonzero(~tok.boundary_lut)
    segs = []
    for i in range(2000):
        seg = rng.choice(allowed, size=int(rng.integers(1, 41))).tolist()
        if i % 10 == 0:
            at = int(rng.integers(0, len(seg) + 1))
            seg[at:at] = spelled[i // 10 % len(spelled)]
        if rare and i in (100, 1500):
            seg[1:1] = rare
        segs.append(seg)
    lens = np.array([len(s) for s in segs], dtype=np.int64)
    ends = np.cumsum(lens)
    return np.concatenate([np.array(s, np.int32) for s in segs]), ends - lens, ends


def _same_outcomes(tok: CheckTokenizer, spelled: list[list[int]], rare: list[int] | None = None) -> list:
    ids32, s_N, e_N = _segments(tok, spelled, 3, rare)
    counted = copy.copy(tok)
    texts_encoded: list[int] = []
    counted.encode_batch = lambda texts: texts_encoded.append(len(texts)) or tok.encode_batch(texts)  # type: ignore[method-assign]
    joined = RoundTripper(counted)._outcomes(ids32, s_N, e_N)
    alone = RoundTripper(tok, joined=False)._outcomes(ids32, s_N, e_N)
    assert joined == alone
    # most segments went to the tokenizer joined (2,000 segments: 32 joined texts, the rest one by one)
    assert RoundTripper(counted).joiner is not None and 32 <= sum(texts_encoded) < 1000
    return joined


def test_joined_round_trips_equal_per_segment_ones_deepseek():
    tok = CheckTokenizer.load(tokenizer_dir())
    joiner = Joiner.of(tok)
    assert joiner == Joiner(0, "<｜begin▁of▁sentence｜>", ("<", "｜"))
    bos = [i for part in ("<", "｜", "begin", "▁of", "▁sentence", "｜", ">") for i in enc(part)]
    user = [i for part in ("<", "｜", "User", "｜", ">") for i in enc(part)]
    assert tok.decode_batch([bos, user]) == ["<｜begin▁of▁sentence｜>", "<｜User｜>"]
    # the separator spelled in two segments: their joined calls are decoded segment by segment
    outcomes = _same_outcomes(tok, [user, enc("<think>"), enc("a < b")], bos)
    failed = [o for o in outcomes if o is not None]
    assert 500 < len(failed) < 1900
    assert any(o.partial_tail for o in failed) and any(not o.partial_tail for o in failed)


@pytest.mark.slow
def test_joined_round_trips_equal_per_segment_ones_qwen(qwen3):  # noqa: F811
    joiner = Joiner.of(qwen3)
    assert joiner is not None and qwen3.encode_batch([joiner.sep_text]) == [[joiner.sep_id]]
    im_start = [i for part in ("<|", "im_start", "|>") for i in qwen3.encode_batch([part])[0]]
    sep = [i for part in (joiner.sep_text[:2], joiner.sep_text[2:]) for i in qwen3.encode_batch([part])[0]]
    outcomes = _same_outcomes(qwen3, [im_start, qwen3.encode_batch(["<x>"])[0]], sep)
    assert any(o is not None for o in outcomes) and any(o is None for o in outcomes)


def test_a_tokenizer_with_a_normalizer_is_called_segment_by_segment():
    tok = CheckTokenizer.load(tokenizer_dir())
    other = copy.copy(tok)
    other.tokenizer = copy.deepcopy(tok.tokenizer)
    other.tokenizer.normalizer = normalizers.NFC()
    assert Joiner.of(other) is None
    assert RoundTripper(other).joiner is None


def test_a_pre_tokenizer_that_looks_beyond_its_piece_is_called_segment_by_segment():
    tok = CheckTokenizer.load(tokenizer_dir())
    other = copy.copy(tok)
    other.tokenizer = copy.deepcopy(tok.tokenizer)
    other.tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    assert Joiner.of(other) is None
    assert RoundTripper(other).joiner is None
