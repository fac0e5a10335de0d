"""Top-k heads from vLLM made exact: chat lists in vLLM's sampled-first order (the first k entries of a dict that
holds the sampled token first) keep the exact top k - 1, one k per response; completions dicts that hold the sampled
token beside the k best lose it, also where that happens at every position."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.formats.base import ParseOptions, Quarantined, Sample
from prl.formats.vllm import VllmChat, VllmCompletions


def _chat(choices: list[list[tuple[int, float, list[tuple[int, float]]]]]) -> dict[str, Any]:
    """A chat.completion whose choices hold (sampled id, its logprob, head as sent) per position."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": "x"},
                "finish_reason": "length",
                "token_ids": [t for t, _, _ in positions],
                "logprobs": {
                    "content": [
                        {
                            "token": f"token_id:{t}",
                            "logprob": lp,
                            "top_logprobs": [{"token": f"token_id:{h}", "logprob": v} for h, v in head],
                        }
                        for t, lp, head in positions
                    ]
                },
            }
            for i, positions in enumerate(choices)
        ],
    }


def _text(choices: list[list[tuple[int, float, list[tuple[int, float]]]]]) -> dict[str, Any]:
    """A text_completion whose choices hold (sampled id, its logprob, top-k dict entries) per position."""
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [
            {
                "index": i,
                "text": "x",
                "prompt_token_ids": [1, 2, 3],
                "token_ids": [t for t, _, _ in positions],
                "finish_reason": "length",
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t, _, _ in positions],
                    "token_logprobs": [lp for _, lp, _ in positions],
                    "top_logprobs": [{f"token_id:{h}": v for h, v in head} for _, _, head in positions],
                },
            }
            for i, positions in enumerate(choices)
        ],
    }


def _heads(items: list[Sample | Quarantined]) -> list[list[list[int]] | None]:
    out: list[list[list[int]] | None] = []
    for item in items:
        assert isinstance(item, Sample), item
        out.append(None if item.topk_ids is None else item.topk_ids.to_pylist())
    return out


def _logprob_heads(items: list[Sample | Quarantined]) -> list[list[list[float]] | None]:
    return [None if s.topk_logprobs is None else s.topk_logprobs.to_pylist() for s in items]  # type: ignore[union-attr]


def test_sampled_first_chat_heads_keep_the_exact_top_k_minus_one_for_the_whole_response():
    """Choice 0 sampled the best token (sorted lists); choice 1 sampled one below the top 3 (unsorted): both keep
    2 entries, the best first."""
    obj = _chat(
        [
            [(10, -0.5, [(10, -0.5), (11, -1.0), (12, -2.0)])],
            [(20, -4.0, [(20, -4.0), (21, -0.25), (22, -1.5)]), (30, -1.0, [(30, -1.0), (31, -0.5), (32, -3.0)])],
        ]
    )
    items = VllmChat().parse(obj, ParseOptions())
    assert _heads(items) == [[[10, 11]], [[21, 22], [31, 30]]]
    assert _logprob_heads(items) == [[[-0.5, -1.0]], [[-0.25, -1.5], [-0.5, -1.0]]]


def test_chat_heads_that_are_sorted_or_not_sampled_first_are_kept_as_sent():
    sorted_heads = _chat([[(10, -0.5, [(10, -0.5), (11, -1.0), (12, -2.0)])]])
    assert _heads(VllmChat().parse(sorted_heads, ParseOptions())) == [[[10, 11, 12]]]
    other = _chat([[(10, -0.5, [(11, -1.0), (10, -0.5), (12, -2.0)])]])  # not sampled-first: check-tokens judges it
    assert _heads(VllmChat().parse(other, ParseOptions())) == [[[11, 10, 12]]]
    uneven = _chat([[(10, -3.0, [(10, -3.0), (11, -1.0), (12, -2.0)]), (13, -0.5, [(13, -0.5), (14, -1.0)])]])
    assert _heads(VllmChat().parse(uneven, ParseOptions())) == [[[10, 11, 12], [13, 14]]]


def test_completions_dicts_with_the_sampled_token_extra_at_every_position_keep_the_top_k():
    every = _text(
        [
            [
                (9, -5.0, [(9, -5.0), (1, -1.0), (2, -2.0), (3, -3.0)]),
                (8, -6.0, [(8, -6.0), (4, -0.5), (5, -1.5), (6, -2.5)]),
            ]
        ]
    )
    items = VllmCompletions().parse(every, ParseOptions())
    assert _heads(items) == [[[1, 2, 3], [4, 5, 6]]]
    assert _logprob_heads(items) == [[[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]]]
    # one choice shows k = 3 (the sampled token inside the top 3): the other choice's 4-entry dicts lose it
    mixed = _text(
        [
            [(9, -5.0, [(9, -5.0), (1, -1.0), (2, -2.0), (3, -3.0)])],
            [(4, -0.5, [(4, -0.5), (5, -1.5), (6, -2.5)])],
        ]
    )
    assert _heads(VllmCompletions().parse(mixed, ParseOptions())) == [[[1, 2, 3]], [[4, 5, 6]]]
    # dicts of one size where a sampled token is not last: the sampled token is inside the top k, nothing is extra
    inside = _text([[(2, -2.0, [(2, -2.0), (1, -1.0), (3, -3.0)]), (9, -5.0, [(9, -5.0), (4, -0.5), (5, -1.5)])]])
    assert _heads(VllmCompletions().parse(inside, ParseOptions())) == [[[1, 2, 3], [4, 5, 9]]]


@st.composite
def _vllm_answers(draw: Any) -> tuple[int, list[list[tuple[int, np.ndarray]]]]:
    """k, then per choice per position: the sampled token and the position's logprobs over a vocabulary of 8
    (distinct values)."""
    k = draw(st.integers(2, 4))
    choices = []
    for _ in range(draw(st.integers(1, 3))):
        positions = []
        for _ in range(draw(st.integers(1, 4))):
            order = draw(st.permutations(range(8)))
            logprobs = -np.array(order, np.float64) - 0.5  # distinct, exact in binary
            positions.append((draw(st.integers(0, 7)), logprobs))
        choices.append(positions)
    return k, choices


def _vllm_dict(sampled: int, logprobs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """vLLM's per-position dict: the sampled token first, then the k best in rank order (a repeat is not added)."""
    out = {sampled: float(logprobs[sampled])}
    for token in np.argsort(-logprobs)[:k]:
        out.setdefault(int(token), float(logprobs[token]))
    return list(out.items())


@settings(max_examples=150, deadline=None)
@given(_vllm_answers())
def test_vllm_heads_are_always_an_exact_top_of_one_width_per_response(answer):
    k, choices = answer
    best = [[[int(t) for t in np.argsort(-lps)] for _, lps in positions] for positions in choices]
    chat = [[(s, float(lps[s]), _vllm_dict(s, lps, k)[:k]) for s, lps in positions] for positions in choices]
    heads = _heads(VllmChat().parse(_chat(chat), ParseOptions()))
    widths = {len(h) for sample in heads for h in sample}  # type: ignore[union-attr]
    unsorted = any(
        s != ranking[0] for positions, rankings in zip(choices, best) for (s, _), ranking in zip(positions, rankings)
    )
    assert widths == ({k - 1} if unsorted else {k})
    assert heads == [
        [ranking[: len(h)] for h, ranking in zip(sample, rankings)] for sample, rankings in zip(heads, best)
    ]  # type: ignore[arg-type]
    text = [[(s, float(lps[s]), _vllm_dict(s, lps, k)) for s, lps in positions] for positions in choices]
    heads = _heads(VllmCompletions().parse(_text(text), ParseOptions()))
    widths = {len(h) for sample in heads for h in sample}  # type: ignore[union-attr]
    ranks = [
        ranking.index(s) for positions, rankings in zip(choices, best) for (s, _), ranking in zip(positions, rankings)
    ]
    assert widths == ({k - 1} if all(r == k - 1 for r in ranks) else {k})
    assert heads == [
        [ranking[: len(h)] for h, ranking in zip(sample, rankings)] for sample, rankings in zip(heads, best)
    ]  # type: ignore[arg-type]
