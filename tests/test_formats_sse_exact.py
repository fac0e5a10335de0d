"""The exact SSE path: lazy framing and one-pass decoding agree with the eager per-chunk reader
(:mod:`tests.sse_reference`) on fixtures, generated streams and hostile lines, and a streamed response gives the
samples of the same response not streamed. The generators here serve the bulk path's tests too."""

from __future__ import annotations

import gc
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prl.formats.base import ParseOptions, Quarantined, Sample
from prl.formats.sse.exact import Sse, resolve
from prl.formats.vllm import VllmChat
from tests.formats_helpers import FIXTURES, json_paths, lines_of
from tests.sse_reference import lazy_items, reference_frame, reference_items, sample_key

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- generated responses and their streams ----------------------------------------------------------------


@st.composite
def responses(draw: Any, min_tokens: int = 0) -> dict[str, Any]:
    """A chat response with n choices, each as tokens, logprobs, top-k heads, text pieces and a finish."""
    k = draw(st.integers(0, 2))
    choices = []
    for index in range(draw(st.integers(1, 3))):
        length = draw(st.integers(min_tokens, 6))
        ids = draw(st.lists(st.integers(0, 129279), min_size=length, max_size=length))
        lps = draw(st.lists(st.floats(-20, 0, width=32), min_size=length, max_size=length))
        texts = draw(st.lists(st.text(max_size=3), min_size=length, max_size=length))
        heads = [
            [{"token": f"token_id:{draw(st.integers(0, 129279))}", "logprob": lp - 1.0 - j} for j in range(k)]
            for lp in lps
        ]
        entries = [
            {"token": f"token_id:{i}", "logprob": lp, "bytes": [1, 2], "top_logprobs": h}
            for i, lp, h in zip(ids, lps, heads)
        ]
        finish = draw(st.sampled_from(["stop", "length", None]))
        choices.append({"index": index, "ids": ids, "entries": entries, "texts": texts, "finish": finish})
    prompt = draw(st.lists(st.integers(0, 129279), min_size=1, max_size=5))
    return {"id": f"chatcmpl-{draw(st.integers(0, 10**6))}", "prompt": prompt, "choices": choices}


@st.composite
def streams(draw: Any, response: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of ``response``: each choice split at random points, choices interleaved at random, some
    chunks carrying two choices, with an optional role chunk first and usage chunk last."""
    top = {"id": response["id"], "object": "chat.completion.chunk", "created": 1767225600, "model": "m"}
    pieces: list[list[dict[str, Any]]] = []
    for c in response["choices"]:
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(c["ids"]) - 1)), max_size=3)))
        bounds = [0, *[x for x in cuts if x < len(c["ids"])], len(c["ids"])]
        own = []
        early = draw(st.sampled_from([None, None, "length"])) if c["finish"] else None  # the last finish wins
        for a, b in itertools.pairwise(bounds):
            own.append(
                {
                    "index": c["index"],
                    "delta": {"content": "".join(c["texts"][a:b])},
                    "logprobs": {"content": c["entries"][a:b]},
                    "finish_reason": c["finish"] if b == len(c["ids"]) else early,
                    "token_ids": c["ids"][a:b],
                }
            )
        pieces.append(own)
    order = draw(st.permutations([i for i, own in enumerate(pieces) for _ in own]))
    queue = [list(own) for own in pieces]
    chunks: list[dict[str, Any]] = []
    for i in order:
        piece = queue[i].pop(0)
        if chunks and draw(st.booleans()) and all(ch["index"] != i for ch in chunks[-1]["choices"]):
            chunks[-1]["choices"].append(piece)  # two choices in one chunk
        else:
            chunks.append({**top, "choices": [piece]})
    role = [
        {"index": c["index"], "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for c in response["choices"]
    ]
    if draw(st.booleans()) or not chunks:
        chunks.insert(0, {**top, "choices": role})
    chunks[0]["prompt_token_ids"] = response["prompt"]
    if draw(st.booleans()):
        chunks.append({**top, "choices": [], "usage": {"prompt_tokens": len(response["prompt"])}})
    return chunks


def _line(chunk: dict[str, Any], style: int) -> bytes:
    if style == 0:
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode()
    if style == 1:
        return b"data: " + json.dumps(chunk).encode()  # '{"id": "..."' with blanks
    return b"data:" + json.dumps({k: chunk[k] for k in sorted(chunk)}).encode()  # id not the first key


def _non_streamed(response: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": response["id"],
        "object": "chat.completion",
        "created": 1767225600,
        "model": "m",
        "prompt_token_ids": response["prompt"],
        "choices": [
            {
                "index": c["index"],
                "message": {"role": "assistant", "content": "".join(c["texts"])},
                "logprobs": {"content": c["entries"]},
                "finish_reason": c["finish"],
                "token_ids": c["ids"],
            }
            for c in response["choices"]
        ],
    }


# --- mutations (used by the bulk path's tests) --------------------------------------------------------------


scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.text(max_size=3)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


def mutate(data: Any, chunks: list[dict[str, Any]]) -> None:
    """Delete or replace (with any JSON value) one to three values somewhere in ``chunks``, in place."""
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(json_paths(chunks, width=3)[1:]))
        parent: Any = chunks
        for part in path[:-1]:
            parent = parent[part]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(json_values)


# --- samples ----------------------------------------------------------------------------------------------


@PROPS
@given(data=st.data())
def test_streamed_and_non_streamed_responses_give_the_same_samples(data):
    response = data.draw(responses(min_tokens=1))
    chunks = data.draw(streams(response))
    lines = [(i, _line(c, 0)) for i, c in enumerate(chunks, start=1)] + [(len(chunks) + 1, b"data: [DONE]")]
    streamed = [item for _, item in lazy_items(lines)]
    whole = []
    for item in VllmChat().parse(_non_streamed(response), ParseOptions()):
        if isinstance(item, Sample) and item.finish_reason is None:
            message = "the stream ended without a finish_reason for this choice"
            item = Quarantined("truncated_stream", message, item.choice_index)
        whole.append(item)
    assert len(streamed) == len(whole)
    for s, w in zip(streamed, whole):
        if isinstance(w, Sample):
            assert s == sample_key(w)
        else:
            assert s == (w.reason, w.message, w.choice_index)


def test_fixture_streams_read_alike():
    lines = lines_of(FIXTURES / "sse/streams.sse")
    lazy, reference = lazy_items(lines), reference_items(lines)
    assert lazy == reference
    assert [line for line, _ in lazy] == [3, 23, 23, 31, 33, 39]


# --- framing --------------------------------------------------------------------------------------------

JUNK = [
    b"",
    b"   ",
    b": keep-alive",
    b"event: message",
    b"id: 7",
    b"hello",
    b"data: {nope",
    b"data: {}",
    b"data: null",
    b'data: {"id": 5, "object": "chat.completion.chunk", "choices": []}',
    b'data: {"object": "chat.completion.chunk", "id": "other", "choices": []}',
    b'data: {"id":"x","v":NaN}',
    b"data:\x0c{}",
    b'data: {"error": {"message": "overloaded"}}',
]


def _mutate_line(line: bytes, how: int) -> bytes:
    body = line[:-1]
    return [
        body + b',"id":"zz"}',  # a second top-level id after the first
        body + b',"\\u0069d":"zz"}',  # the same, spelled with escapes
        body + b',"tool":{"id":"t"}}',  # an id inside a nested object
        line[: len(line) // 2],  # cut
        line.replace(b'"id"', b'"id" ', 1),  # blanks inside the first key
        line + b"  ",
    ][how]


@st.composite
def capture_lines(draw: Any) -> list[tuple[int, bytes]]:
    lines: list[bytes] = []
    for _ in range(draw(st.integers(1, 3))):
        style = draw(st.integers(0, 2))
        for chunk in draw(streams(draw(responses()))):
            line = _line(chunk, style)
            if draw(st.integers(0, 9)) == 0:
                line = _mutate_line(line, draw(st.integers(0, 5)))
            lines.append(line)
            if draw(st.integers(0, 3)) == 0:
                lines.append(draw(st.sampled_from(JUNK)))
            else:
                lines.append(b"")
        if draw(st.integers(0, 4)):
            lines.append(b"data: [DONE]")
    return list(enumerate(lines, start=1))


def _record_key(record: Any) -> tuple:
    error = None if record.error is None else (record.error.reason, record.error.message)
    return (record.line, record.raw, repr(record.obj), error)


@PROPS
@given(lines=capture_lines())
def test_lazy_frames_resolve_to_the_eager_frames(lines):
    lazy = [_record_key(resolve(r)) for r in Sse().frame(iter(lines))]
    assert lazy == [_record_key(r) for r in reference_frame(iter(lines))]


@PROPS
@given(lines=capture_lines())
def test_captures_read_alike(lines):
    assert lazy_items(lines) == reference_items(lines)


def test_a_malformed_chunk_mid_stream_quarantines_the_stream_as_before():
    good = [
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"},'
        b'"token_ids":[5],"logprobs":{"content":[{"token":"token_id:5","logprob":-0.5}]}}],"prompt_token_ids":[1]}',
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"b"},'
        b'"token_ids":[6],"logprobs":{"content":[{"token":"token_id:6","logprob":-0.25}]},"finish_reason":"stop"}]}',
    ]
    bad = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"'
    lines = list(enumerate([good[0], b"", bad, b"", good[1], b"data: [DONE]"], start=1))
    (record,) = Sse().frame(iter(lines))
    assert record.error is None  # found when the stream is decoded
    out = lazy_items(lines)
    assert out == reference_items(lines)
    ((line, (reason, message, index)),) = out
    assert (line, reason, index) == (1, "malformed_json", None)
    assert message.startswith("line 3: not valid JSON: ")
    # without the bad line the stream is one sample
    assert [item[0] for _, item in lazy_items([lines[0], lines[4], lines[5]])] == [("request_id", "c")]


def test_parse_never_switches_the_collector_off(monkeypatch):
    def disable() -> None:
        raise AssertionError("the SSE reader switched the garbage collector off")

    monkeypatch.setattr(gc, "disable", disable)
    lines = lines_of(FIXTURES / "sse/streams.sse")
    assert lazy_items(lines) == reference_items(lines)
    assert gc.isenabled()


def test_framed_lines_that_are_not_bytes_are_bad_shape():
    fmt = Sse()
    obj = {"sse_lines": ["data: {}"], "sse_line_numbers": [1], "sse_done": True}
    try:
        fmt.parse(obj, ParseOptions())
    except Quarantined as q:
        assert q.reason == "bad_shape"
    else:
        raise AssertionError("expected bad_shape")


@pytest.mark.parametrize(
    "obj",
    [
        {"sse_text": ""},
        {"sse_text": None},
        {"sse_text": "data: {}\n\ndata: [DONE]", "sse_first_line": 1},
        {"sse_text": b"data: {}\n\ndata: [DONE]", "sse_first_line": "1"},
        {"sse_text": b"data: {}\n\ndata: [DONE]"},
    ],
)
def test_framed_text_that_is_not_bytes_with_a_line_number_is_bad_shape(obj):
    """Decoded JSON that happens to use the framer's keys (found by the fuzz test) is quarantined, never a
    crash."""
    with pytest.raises(Quarantined, match="a framed stream holds text that is not bytes with its line number") as q:
        Sse().parse(obj, ParseOptions())
    assert q.value.reason == "bad_shape"
