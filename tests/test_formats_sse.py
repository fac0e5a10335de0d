"""SSE stream captures: framing, joining chunks per choice, truncation."""

from __future__ import annotations

import json

from prl.formats.base import ParseOptions, Quarantined
from prl.formats.registry import detect_file
from prl.formats.sse.exact import Sse
from tests.formats_helpers import C1, C2, FIXTURES, L1, P1, P2, heads, lines_of, parse_file, reasons, samples


def test_detected_and_framed_one_record_per_stream():
    lines = lines_of(FIXTURES / "sse/streams.sse")
    assert detect_file("s", lines).name == "sse"
    records = list(Sse().frame(iter(lines)))
    assert [r.line for r in records] == [3, 23, 31, 33, 39]
    assert [r.obj["sse_done"] for r in records] == [True, True, False, True, False]


def test_streams_join_like_the_non_streamed_response():
    items = parse_file("sse", "sse/streams.sse")
    s1, s2a, s2b, s4 = samples(items)
    assert (s1.request_id, s1.finish_reason, s1.model) == ("chatcmpl-s1", "stop", "deepseek-v4")
    assert s1.prompt_token_ids.to_pylist() == P1
    assert s1.completion_token_ids.to_pylist() == C1 and s1.completion_logprobs.to_pylist() == L1
    assert heads(s1) == ([[i, 400 + k] for k, i in enumerate(C1)], [[lp, lp - 2.0] for lp in L1])
    # n = 2: choices interleave and finish in either order; both share the prompt from the first chunk
    assert [(s.choice_index, s.finish_reason) for s in (s2a, s2b)] == [(0, "stop"), (1, "length")]
    assert s2a.completion_logprobs.to_pylist() == [-0.5, -0.125]
    assert s2b.completion_logprobs.to_pylist() == [-0.5, -0.25]
    assert s2a.prompt_token_ids.to_pylist() == s2b.prompt_token_ids.to_pylist() == P2
    assert s2a.completion_text == "Par"
    # streamed text_completion: prompt per choice, dict heads
    assert (s4.request_id, s4.completion_token_ids.to_pylist()) == ("cmpl-s4", C2)
    assert s4.completion_text == "Paris"
    assert heads(s4) == ([[51119, 9], [1, 8]], [[-0.5, -1.0], [-0.25, -2.0]])
    assert reasons(items) == [(31, "truncated_stream"), (39, "truncated_stream")]


def _stream(*chunks, done=True) -> list[tuple[int, bytes]]:
    lines = [f"data: {json.dumps(c)}".encode() for c in chunks]
    if done:
        lines.append(b"data: [DONE]")
    return list(enumerate(lines, start=1))


def _parse(lines):
    out = []
    fmt = Sse()
    for record in fmt.frame(iter(lines)):
        if record.error is not None:
            out.append(record.error)
            continue
        try:
            out.extend(fmt.parse(record.obj, ParseOptions()))
        except Quarantined as q:
            out.append(q)
    return out


def _chunk(choices, **extra):
    return {"id": "c", "object": "chat.completion.chunk", "choices": choices, **extra}


def test_choice_without_finish_reason_is_truncated():
    lp = {"content": [{"token": "token_id:5", "logprob": -0.5}]}
    out = _parse(_stream(_chunk([{"index": 0, "delta": {}, "token_ids": [5], "logprobs": lp}], prompt_token_ids=[1])))
    assert [(q.reason, q.choice_index) for q in out] == [("truncated_stream", 0)]


def test_bad_streams():
    assert [q.reason for q in _parse([(1, b"data: {nope"), (2, b"data: [DONE]")])] == ["malformed_json"]
    assert [q.reason for q in _parse([(1, b"hello")])] == ["malformed_sse"]
    assert [q.reason for q in _parse(_stream({"error": {"message": "overloaded"}, "object": "x"}))] == [
        "upstream_error"
    ]
    assert [q.reason for q in _parse(_stream(_chunk("nope")))] == ["bad_shape"]
    lp = {"content": "nope"}
    out = _parse(_stream(_chunk([{"index": 0, "token_ids": [5], "logprobs": lp, "finish_reason": "stop"}])))
    assert [(q.reason, q.choice_index) for q in out] == [("bad_shape", 0)]
    assert _parse([(1, b"data: [DONE]"), (2, b": keep-alive"), (3, b"")]) == []


def test_many_token_stream_is_fast():
    import time

    n = 20_000
    chunks = [
        _chunk(
            [
                {
                    "index": 0,
                    "delta": {"content": "x"},
                    "token_ids": [7],
                    "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5, "top_logprobs": []}]},
                    "finish_reason": "stop" if i == n - 1 else None,
                }
            ],
            **({"prompt_token_ids": [1, 2]} if i == 0 else {}),
        )
        for i in range(n)
    ]
    lines = _stream(*chunks)
    started = time.process_time()  # this process's CPU time: a quadratic parse shows, a loaded machine does not
    (sample,) = _parse(lines)
    elapsed = time.process_time() - started
    assert len(sample.completion_token_ids) == n and sample.completion_logprobs.to_pylist()[-1] == -0.5
    assert elapsed < 5.0, elapsed
