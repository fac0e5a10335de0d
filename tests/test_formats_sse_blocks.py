"""SSE block framing and the bulk Arrow join (:meth:`prl.formats.sse.exact.Sse.frame_blocks`) read every capture
exactly as the per-chunk reader does (:mod:`tests.sse_reference`): generated, mutated and hostile streams,
cut into blocks anywhere, with the bulk path taken where the layout is the servers'."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prl.formats.base import ParseOptions, Quarantined
from prl.formats.sse import blocks as sse_blocks
from prl.formats.sse import bulk as sse_arrow
from prl.formats.sse.bulk import UNJOINED, join_streams, payloads
from prl.formats.sse.exact import JOINED_KEY, TEXT_KEY, Sse
from tests.formats_helpers import FIXTURES, lines_of
from tests.sse_reference import as_blocks, block_items, reference_items
from tests.test_formats_sse_exact import PROPS, _line, capture_lines, mutate, responses, streams


def _canonical(chunks: list[dict[str, Any]], done: bool = True) -> list[bytes]:
    """A stream as vLLM writes it: compact ``data:`` lines, each followed by a blank line."""
    out: list[bytes] = []
    for chunk in chunks:
        out += [_line(chunk, 0), b""]
    return [*out, b"data: [DONE]", b""] if done else out


def _numbered(lines: list[bytes]) -> list[tuple[int, bytes]]:
    return list(enumerate(lines, start=1))


def _records(lines: list[tuple[int, bytes]], cuts: tuple[int, ...] = ()) -> list[Any]:
    return list(Sse().frame_blocks(as_blocks(lines, cuts)))


@st.composite
def cuts_for(draw: Any, lines: list[tuple[int, bytes]]) -> tuple[int, ...]:
    return tuple(draw(st.sets(st.integers(1, max(1, len(lines))), max_size=4)))


@PROPS
@given(data=st.data())
def test_captures_cut_into_blocks_read_alike(data):
    lines = data.draw(capture_lines())
    cuts = data.draw(cuts_for(lines))
    assert block_items(lines, cuts) == reference_items(lines)


@PROPS
@given(data=st.data())
def test_single_choice_streams_take_the_bulk_join_and_read_alike(data):
    lines: list[bytes] = []
    for _ in range(data.draw(st.integers(1, 3))):
        response = data.draw(responses(min_tokens=1))
        response["choices"] = response["choices"][:1]
        lines += _canonical(data.draw(streams(response)))
    numbered = _numbered(lines)
    cuts = data.draw(cuts_for(numbered))
    records = _records(numbered, cuts)
    assert all(JOINED_KEY in r.obj for r in records)
    assert block_items(numbered, cuts) == reference_items(numbered)


@PROPS
@given(data=st.data())
def test_mutated_single_choice_streams_read_alike(data):
    response = data.draw(responses())
    response["choices"] = response["choices"][:1]
    chunks = data.draw(streams(response))
    mutate(data, chunks)
    numbered = _numbered(_canonical(chunks))
    assert block_items(numbered) == reference_items(numbered)


@PROPS
@given(
    logprobs=st.lists(
        st.floats(max_value=0.0, allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 0),
        min_size=1,
        max_size=6,
    )
)
def test_logprobs_of_any_spelling_read_alike(logprobs):
    top = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    chunks: list[dict[str, Any]] = [{**top, "choices": [], "prompt_token_ids": [1, 2]}]
    for i, lp in enumerate(logprobs):
        entry = {"token": f"token_id:{i}", "logprob": lp, "top_logprobs": [{"token": "token_id:9", "logprob": lp}]}
        finish = "stop" if i == len(logprobs) - 1 else None
        choice = {"index": 0, "delta": {"content": "x"}, "logprobs": {"content": [entry]}, "token_ids": [i]}
        chunks.append({**top, "choices": [{**choice, "finish_reason": finish}]})
    numbered = _numbered(_canonical(chunks))
    assert block_items(numbered) == reference_items(numbered)


HEAD = b'data: {"id":"s","object":"chat.completion.chunk","choices":'


def _stream(*extra: bytes, first: bytes | None = None, choices: int = 1) -> list[bytes]:
    """A small canonical stream of two tokens, with ``extra`` lines before its [DONE]."""
    head = HEAD[len(b"data: ") :]  # the head of every token line (and of the hostile lines that keep it)
    opening = first or head + b'[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[7,8]}'
    lines = [b"data: " + opening, b""]
    for token in (5, 6):
        for index in range(choices):
            finish = b'"stop"' if token == 6 else b"null"
            lines += [
                b"data: " + head + b'[{"index":%d,"delta":{"content":"t%d"},"logprobs":{"content":[{"token":'
                b'"token_id:%d","logprob":-0.5,"top_logprobs":[]}]},"finish_reason":%s,"token_ids":[%d]}]}'
                % (index, token, token, finish, token),
                b"",
            ]
    for line in extra:
        lines += [line, b""]
    return [*lines, b"data: [DONE]", b""]


HOSTILE = {
    "plain": [],
    "usage chunk": [HEAD + b'[],"usage":{"prompt_tokens":2}}'],
    "another id": [b'data: {"id":"t","object":"chat.completion.chunk","choices":[]}'],
    "id as a number": [b'data: {"id":5,"object":"chat.completion.chunk","choices":[]}'],
    "escaped id key": [b'data: {"\\u0069d":"t","object":"chat.completion.chunk","choices":[]}'],
    "second id key": [HEAD + b'[],"id":"t"}'],
    "NaN logprob": [HEAD + b'[{"index":0,"delta":{},"logprobs":{"content":[{"token":"token_id:1","logprob":NaN}]}}]}'],
    "Infinity elsewhere": [HEAD + b'[],"x":Infinity}'],
    "Inf elsewhere": [HEAD + b'[],"x":-Inf}'],
    "NaN elsewhere": [HEAD + b'[],"x":NaN}'],
    "big integer logprob": [
        HEAD + b'[{"index":0,"delta":{},"logprobs":{"content":[{"token":"token_id:1","logprob":-9007199254740993}]}}]}'
    ],
    "not UTF-8": [HEAD + b'[{"index":0,"delta":{"content":"\xff"}}]}'],
    "two objects on a line": [HEAD + b"[]}" + HEAD[6:] + b"[]}"],
    "two objects and an empty payload": [HEAD + b"[]}" + HEAD[6:] + b"[]}", b"data:"],
    "two objects and a blank payload": [HEAD + b"[]}" + HEAD[6:] + b"[]}", b"data:   "],
    "no space after data:": [b"data:" + HEAD[6:] + b"[]}"],
    "empty payload": [b"data:"],
    "comment": [b": keep-alive"],
    "event field": [b"event: message"],
    "not data": [b"hello"],
    "malformed": [HEAD + b"[{"],
    "duplicate key": [HEAD + b'[],"object":"x"}'],
    "null object after choices": [HEAD + b'[],"object":null}'],
    "escaped object key after choices": [HEAD + b'[],"\\u006fbject":null}'],
    "another head": [b'data: {"id":"s","object":"chat.completion.chunk","model":"x","choices":[]}'],
    "head with an error": [b'data: {"id":"s","object":"chat.completion.chunk","error":null,"choices":[]}'],
    "head of another object": [b'data: {"id":"s","object":"chat.completion","choices":[]}'],
    "error object": [HEAD + b'[],"error":{"message":"overloaded"}}'],
    "null error": [HEAD + b'[],"error":null}'],
    "delta token_ids": [HEAD + b'[{"index":0,"delta":{"content":"a","token_ids":[9]},"token_ids":null}]}'],
    "legacy logprob lists": [HEAD + b'[{"index":0,"delta":{},"logprobs":{"tokens":"x"}}]}'],
    "choice index null": [HEAD + b'[{"index":null,"delta":{}}]}'],
    "choice index 1": [HEAD + b'[{"index":1,"delta":{"content":"b"},"finish_reason":"stop"}]}'],
    "choice missing delta": [HEAD + b'[{"index":0,"finish_reason":"stop"}]}'],
    "null choice": [HEAD + b"[null]}"],
    "choice as number": [HEAD + b"[5]}"],
    "finish as number": [HEAD + b'[{"index":0,"delta":{},"finish_reason":5}]}'],
    "text as number": [HEAD + b'[{"index":0,"delta":{"content":5}}]}'],
    "token id as float": [HEAD + b'[{"index":0,"delta":{},"token_ids":[1.0]}]}'],
    "token id too big": [HEAD + b'[{"index":0,"delta":{},"token_ids":[99999999999999999999]}]}'],
    "prompt ids after choices": [HEAD + b'[],"prompt_token_ids":[1]}'],
    "choice prompt ids": [HEAD + b'[{"index":0,"delta":{},"prompt_token_ids":[3]}]}'],
    "form feed after data:": [b'data:\x0c{"id":"s","object":"chat.completion.chunk","choices":[]}'],
    "blanks at the end": [HEAD + b"[]}  "],
    "form feed at the end": [HEAD + b"[]}\x0c"],
    "reasoning content": [HEAD + b'[{"index":0,"delta":{"reasoning_content":"hm"},"stop_reason":null}]}'],
    "extra entry keys": [
        HEAD + b'[{"index":0,"delta":{},"logprobs":{"content":[{"token":"token_id:1","logprob":-1,"bytes":[1]}]}}]}'
    ],
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("cut", [False, True])
def test_hostile_lines_inside_a_stream_read_alike(name, cut):
    lines = _numbered([*_stream(*HOSTILE[name]), *_stream()])
    cuts = (3,) if cut else ()
    assert block_items(lines, cuts) == reference_items(lines)


def test_streams_in_the_servers_layout_take_the_bulk_join():
    lines = _numbered([*_stream(), *_stream(HOSTILE["usage chunk"][0]), *_stream(HOSTILE["reasoning content"][0])])
    records = _records(lines)
    assert [JOINED_KEY in r.obj for r in records] == [True, True, True]
    assert block_items(lines) == reference_items(lines)
    ((line, sample), *_) = block_items(lines)
    fields = dict(sample)
    assert line == 1
    assert fields["prompt_token_ids"] == ("int64", "[7, 8]")
    assert fields["completion_token_ids"] == ("int64", "[5, 6]")
    assert fields["completion_logprobs"] == ("double", "[-0.5, -0.5]")
    assert fields["completion_text"] == "t5t6"
    assert fields["finish_reason"] == "stop"


def test_a_multi_choice_stream_is_one_stream_joined_chunk_by_chunk():
    lines = _numbered(_stream(choices=2))
    (record,) = _records(lines)
    assert TEXT_KEY in record.obj and JOINED_KEY not in record.obj
    items = block_items(lines)
    assert items == reference_items(lines)
    assert [dict(item)["choice_index"] for _, item in items] == [0, 1]


def test_a_chunk_with_another_id_splits_the_stream_as_the_line_framer_does():
    lines = _numbered(_stream(HOSTILE["another id"][0]))
    records = _records(lines)
    assert [r.line for r in records] == [1, 7]
    assert [TEXT_KEY in r.obj for r in records] == [False, False]
    assert block_items(lines) == reference_items(lines)


def _stream_bytes(lines: list[bytes]) -> bytes:
    """A stream's bytes from its first line through its [DONE] line, as :func:`payloads` takes them."""
    return b"\n".join(lines[:-1]) + b"\n"


def test_bulk_verdicts():
    good = _stream_bytes(_stream())
    assert payloads(good, 4) is None  # a line that is not a data: field
    assert payloads(good.replace(b'"t5"', b'"\xff"'), 3) is None
    rows = payloads(good, 3)
    assert rows is not None
    assert bytes(rows).count(b"\n") == 2 and bytes(rows).startswith(b'{"id":"s"')
    short = payloads(good, 3, stream_id="s")  # the repeated head shortened
    assert short is not None
    assert bytes(short).split(b"\n")[1].startswith(b'{"object":"chat.completion.chunk","choices":[{"index":0')
    assert payloads(good, 3, stream_id="other") == rows  # a head of another stream is kept whole
    multi = payloads(_stream_bytes(_stream(choices=2)), 5)
    assert multi is not None
    verdicts = join_streams([rows, multi, memoryview(b"{nope")], [3, 5, 1])
    assert verdicts[1] is UNJOINED and verdicts[2] is None
    assert verdicts[0] is not None and verdicts[0].choice is not None
    assert verdicts[0].choice.text == "t5t6"


@pytest.mark.parametrize("cuts", [(), (1,), (2,), (5,), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)])
def test_a_stream_cut_anywhere_reads_alike(cuts):
    lines = _numbered([*_stream(), *_stream()])
    assert block_items(lines, cuts) == reference_items(lines)
    assert len(_records(lines, cuts)) == 2


def test_a_failing_bulk_join_leaves_every_stream_to_the_exact_reader(monkeypatch):
    def fail(*args: Any) -> None:
        raise IndexError("unforeseen")

    monkeypatch.setattr(sse_arrow, "_join_table", fail)
    lines = _numbered([*_stream(), *_stream(HOSTILE["usage chunk"][0])])
    records = _records(lines)
    assert [JOINED_KEY in r.obj or TEXT_KEY in r.obj for r in records] == [False, False]
    assert block_items(lines) == reference_items(lines)
    assert len(block_items(lines)) == 2


@pytest.mark.parametrize("ending", [b"", b"\r"])
def test_batches_are_bounded_by_source_bytes_whatever_frames_them(monkeypatch, ending):
    monkeypatch.setattr(sse_blocks, "BULK_BYTES", 200)
    lines = _numbered([line + ending for _ in range(6) for line in _stream()])  # CRLF: line framer only
    blocks = as_blocks(lines, cuts=range(8, len(lines), 8))  # a block a stream
    batches = list(sse_blocks._batches(blocks))
    assert len(batches) >= 5
    assert [r.line for batch in batches for r in batch] == [1, 9, 17, 25, 33, 41]
    assert block_items(lines, range(8, len(lines), 8)) == reference_items(lines)


def test_a_stream_longer_than_the_carry_limit_goes_line_by_line(monkeypatch):
    monkeypatch.setattr(sse_blocks, "CARRY_LIMIT", 10)
    lines = _numbered([*_stream(), *_stream()])
    cuts = (2, 4, 6, 12, 14)
    assert block_items(lines, cuts) == reference_items(lines)


def test_a_capture_without_done_or_with_crlf_or_cut_short_reads_alike():
    base = [*_stream(), *_stream()]
    cases = {
        "no done": [line for line in base if line != b"data: [DONE]"],
        "crlf": [line + b"\r" for line in base],
        "cut short": base[:5],
    }
    for name, raw in cases.items():
        lines = _numbered(raw)
        assert block_items(lines, (3,)) == reference_items(lines), name


def test_an_unterminated_last_line_reads_alike():
    lines = _numbered([*_stream()[:-1], *_stream()[:5]])
    blocks = as_blocks(lines, terminated=False)
    framed = list(Sse().frame_blocks(blocks))
    assert [r.line for r in framed] == [1, 8]
    fmt = Sse()
    last = framed[-1]
    with pytest.raises(Quarantined) as excinfo:
        fmt.parse(last.obj, ParseOptions())
    assert excinfo.value.reason == "truncated_stream"


def test_fixture_captures_cut_into_blocks_read_alike():
    lines = lines_of(FIXTURES / "sse/streams.sse")
    for cuts in [(), (1,), (10, 20), tuple(range(1, len(lines)))]:
        assert block_items(lines, cuts) == reference_items(lines)


def test_payload_rows_match_the_lines():
    chunks = [{"id": "c", "object": "chat.completion.chunk", "choices": [], "n": i} for i in range(3)]
    stream = b"".join(_line(c, 0) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    rows = payloads(stream, 3, trailing=1)
    assert rows is not None
    assert [json.loads(r) for r in bytes(rows).splitlines()] == copy.deepcopy(chunks)
