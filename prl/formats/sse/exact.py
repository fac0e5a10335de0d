"""Server-sent-event stream captures: ``data: {...}`` lines of ``chat.completion.chunk`` or streamed
``text_completion`` objects, ``data: [DONE]`` closing each stream, many streams back to back in one file
(blank lines, ``: comments`` and ``event:``/``id:``/``retry:`` fields between them are ignored).

:meth:`Sse.frame` turns lines into one record per stream (its line number is the stream's first line; a new
chunk ``id`` without a ``[DONE]`` before it starts a new stream). :meth:`Sse.parse` joins each choice's chunks
into the non-streamed response shape (token IDs, ``logprobs.content`` entries, legacy ``tokens`` /
``token_logprobs`` / ``top_logprobs``, text, the last ``finish_reason``; prompt IDs from the first chunk that
has them) and hands it to the matching reader in :mod:`prl.formats.vllm`, so a streamed and a non-streamed
response of the same request give the same sample.

A stream holds one token per chunk, so the hot path avoids per-chunk Python:

- :meth:`Sse.frame_blocks` (what ingest calls) frames whole blocks of the source
  (:mod:`prl.formats.sse.blocks`): a stream laid out as servers write it is cut out with bytes searches, and
  the streams of a batch are parsed together by Arrow's JSON reader and joined in bulk
  (:mod:`prl.formats.sse.bulk`). A stream that is not laid out so, or that the bulk join does not accept,
  goes the ways below, which give the same records and samples.
- :meth:`Sse.frame` (:class:`prl.formats.sse.lines.LineFramer`) keeps a stream's lines as bytes and decodes
  only the lines that could start a new stream. Errors of the other lines surface from :meth:`Sse.parse`,
  with the reason and message the eager framer (:func:`frame_decoded`) gives them; :func:`resolve` turns a
  lazy record into the eager one where a caller needs every error up front.
- :meth:`Sse.parse` decodes the whole stream at once (one ``orjson`` pass over its lines) and joins it with
  :func:`join_chunks` (per chunk, exact), which also explains what is wrong with a stream outside the common
  chat shape.

A stream cut before ``[DONE]``, or a choice that never got a ``finish_reason``, is ``truncated_stream``; an
``error`` object inside a stream is ``upstream_error``; an undecodable chunk makes the stream
``malformed_json``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any, ClassVar

import orjson
import pyarrow as pa

from prl.formats.base import Format, ParseOptions, Quarantined, RawRecord, Sample, may_hold_big_integer
from prl.formats.fields import as_dict, as_list
from prl.formats.guard import text_only_reasons
from prl.formats.sse.blocks import FIRST_KEY, FIRST_LINE_KEY, JOINED_KEY, TEXT_KEY, frame_blocks, with_lines
from prl.formats.sse.bulk import JoinedStream
from prl.formats.sse.lines import (
    DONE_KEY,
    LINE_NUMBERS_KEY,
    LINES_KEY,
    STREAM_KEY,
    LineFramer,
    decode_chunk,
    payload_of,
)
from prl.formats.vllm import VllmChat, VllmCompletions


def is_chunk(obj: Any) -> bool:
    """One streamed chunk: ``object`` ends with ``.chunk``, or a ``text_completion`` chunk (same ``object`` as
    the non-streamed response, told apart by living in a ``data:`` line)."""
    if not isinstance(obj, dict):
        return False
    kind = obj.get("object")
    return isinstance(kind, str) and (kind.endswith(".chunk") or kind == "text_completion")


_AFTER_DATA = itemgetter(slice(5, None))


class Sse(Format):
    """SSE stream captures of OpenAI-style chat or completions streams (vLLM, SGLang, proxies)."""

    name: ClassVar[str] = "sse"
    description: ClassVar[str] = "SSE stream captures: data: {...chunk} lines ending in data: [DONE]"

    def detect(self, obj: Any) -> bool:
        return (
            isinstance(obj, dict)
            and (isinstance(obj.get(STREAM_KEY), list) or isinstance(obj.get(LINES_KEY), list) or TEXT_KEY in obj)
        ) or is_chunk(obj)

    def sniff(self, head: list[RawRecord]) -> bool:
        for record in head:
            r = resolve(record)
            if r.error is None and isinstance(r.obj, dict) and any(is_chunk(c) for c in r.obj.get(STREAM_KEY, [])[:1]):
                return True
        return False

    def frame(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """One lazy record per stream (see the module docstring); the same streams as :func:`frame_decoded`."""
        framer = LineFramer()
        yield from framer.feed(lines)
        yield from framer.finish()

    def frame_blocks(self, blocks: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """The records :meth:`frame` gives for the same lines, streams in the servers' layout framed whole and
        joined in bulk (:func:`prl.formats.sse.blocks.frame_blocks`)."""
        return frame_blocks(blocks)

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        if is_chunk(obj):
            obj = {STREAM_KEY: [obj], DONE_KEY: False}
        obj = as_dict(obj, "stream")
        if TEXT_KEY in obj:
            if type(obj[TEXT_KEY]) is not bytes or type(obj.get(FIRST_LINE_KEY)) is not int:
                raise Quarantined("bad_shape", "a framed stream holds text that is not bytes with its line number")
            joined = obj.get(JOINED_KEY)
            if isinstance(joined, JoinedStream) and type(obj.get(FIRST_KEY)) is dict:
                return read_joined(_bulk_record(obj[FIRST_KEY], joined), options)
            obj = with_lines(obj)
        if LINES_KEY in obj:
            return _parse_lines(obj, options)
        chunks = as_list(obj.get(STREAM_KEY), "stream chunks")
        if not obj.get(DONE_KEY):
            raise Quarantined("truncated_stream", "the stream ended before 'data: [DONE]'")
        return parse_chunks(chunks, options)


def _parse_lines(obj: dict[str, Any], options: ParseOptions) -> list[Sample | Quarantined]:
    """Decode, join and read a lazily framed stream (its chunks decoded in one pass, see
    :func:`_decoded_lines`)."""
    chunks = _decoded_lines(obj)
    if not obj.get(DONE_KEY):
        raise Quarantined("truncated_stream", "the stream ended before 'data: [DONE]'")
    return parse_chunks(chunks, options)


def _bulk_record(first: dict[str, Any], joined: JoinedStream) -> dict[str, Any]:
    """The joined ``chat.completion`` record (as :func:`join_chunks` shapes it) of a stream joined in bulk, its lists as Arrow arrays; ``first`` is its first chunk."""
    record = {k: v for k, v in first.items() if k not in ("choices", "object", "usage")}
    record["object"] = "chat.completion"
    if joined.prompt_token_ids is not None:
        record["prompt_token_ids"] = joined.prompt_token_ids
    record["choices"], record["_truncated"], record["_bad"] = [], [], []
    choice = joined.choice
    if choice is not None:
        out: dict[str, Any] = {"index": 0, "finish_reason": choice.finish_reason}
        if choice.token_ids is not None:
            out["token_ids"] = choice.token_ids
        if choice.prompt_token_ids is not None:
            out["prompt_token_ids"] = choice.prompt_token_ids
        out["message"] = {"role": "assistant", "content": choice.text}
        if choice.content is not None:
            out["logprobs"] = {"content": choice.content}
        record["choices"].append(out)
        if choice.finish_reason is None:
            record["_truncated"].append(0)
    return record


def _decoded_lines(obj: dict[str, Any]) -> list[Any]:
    """Every chunk of a lazily framed stream, decoded in one pass; the first undecodable one raises its
    ``malformed_json`` signal (the error the eager framer records for the stream)."""
    lines = as_list(obj.get(LINES_KEY), "stream lines")
    numbers = as_list(obj.get(LINE_NUMBERS_KEY), "stream line numbers")
    if len(numbers) != len(lines) or not set(map(type, lines)) <= {bytes} or not set(map(type, numbers)) <= {int}:
        raise Quarantined("bad_shape", "a framed stream holds lines that are not bytes with their line numbers")
    try:  # JSON ignores the blanks after "data:" that _payload strips, unless they are not JSON blanks
        if not may_hold_big_integer(b"\n".join(lines)):  # else line by line: decode_json keeps such integers
            return list(map(orjson.loads, map(_AFTER_DATA, lines)))
    except (ValueError, RecursionError):
        pass  # some line needs the standard library, other blanks stripped, or is malformed: line by line
    chunks = []
    for line, line_no in zip(lines, numbers):
        chunk, error = decode_chunk(payload_of(line), line_no)
        if error is not None:
            raise error
        chunks.append(chunk)
    return chunks


def resolve(record: RawRecord) -> RawRecord:
    """The record :func:`frame_decoded` gives for the same lines: every chunk decoded (None where it is
    not JSON) and the stream's first decoding error as the record's error."""
    obj = record.obj
    if isinstance(obj, dict) and TEXT_KEY in obj:
        obj = with_lines(obj)
    if not (isinstance(obj, dict) and LINES_KEY in obj):
        return record
    chunks: list[Any] = []
    error = record.error
    for line, line_no in zip(obj[LINES_KEY], obj[LINE_NUMBERS_KEY]):
        chunk, problem = decode_chunk(payload_of(line), line_no)
        chunks.append(chunk)
        if error is None:
            error = problem
    return RawRecord(record.line, record.raw, {STREAM_KEY: chunks, DONE_KEY: obj[DONE_KEY]}, error)


def frame_decoded(lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
    """Frame like :meth:`Sse.frame`, with every chunk decoded and every stream's first error known up front
    (for callers that pick streams by their errors, such as a response body holding a capture)."""
    for record in Sse().frame(lines):
        yield resolve(record)


def parse_chunks(chunks: list[Any], options: ParseOptions) -> list[Sample | Quarantined]:
    """Samples of one complete stream, given its decoded chunks in order, joined by :func:`join_chunks`
    (which explains what is wrong with a stream it cannot join)."""
    return read_joined(join_chunks(chunks), options)


def read_joined(record: dict[str, Any], options: ParseOptions) -> list[Sample | Quarantined]:
    """Samples of a joined stream (:func:`join_chunks`'s shape): its per-choice signals, then what the
    non-streamed reader makes of it, with choices that never finished as ``truncated_stream``."""
    reader = VllmChat() if record["object"] == "chat.completion" else VllmCompletions()
    out: list[Sample | Quarantined] = []
    truncated = set(record.pop("_truncated"))
    for q in record.pop("_bad"):
        out.append(q)
    if record["choices"]:
        try:
            items = reader.parse(record, options)
        except Quarantined as q:
            items = [q]
        out.extend(items if _holds_arrays(record) else text_only_reasons(record, items))
    message = "the stream ended without a finish_reason for this choice"
    for position, item in enumerate(out):
        if isinstance(item, Quarantined) and item.choice_index in truncated:
            item.reason, item.message = "truncated_stream", message
        elif isinstance(item, Sample) and item.choice_index in truncated:
            out[position] = Quarantined("truncated_stream", message, item.choice_index)
    return out


def _holds_arrays(record: dict[str, Any]) -> bool:
    """Whether a joined stream holds lists already converted to Arrow (joined in bulk), which the text-only walk
    (:func:`prl.formats.guard.text_only_reasons`) does not look into."""
    if isinstance(record.get("prompt_token_ids"), pa.Array):
        return True
    for choice in record["choices"]:
        logprobs = choice.get("logprobs")
        values = [choice.get("token_ids"), choice.get("prompt_token_ids")]
        values += list(logprobs.values()) if isinstance(logprobs, dict) else []
        if any(isinstance(v, pa.Array) for v in values):
            return True
    return False


class _Choice:
    __slots__ = (
        "finish",
        "index",
        "lp_content",
        "lp_tokens",
        "lp_top",
        "lp_values",
        "prompt",
        "text",
        "token_ids",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.token_ids: list[Any] | None = None
        self.lp_content: list[Any] | None = None
        self.lp_tokens: list[Any] | None = None
        self.lp_values: list[Any] | None = None
        self.lp_top: list[Any] | None = None
        self.text: list[str] = []
        self.prompt: Any = None
        self.finish: Any = None


def _extend(target: list[Any] | None, values: Any, what: str) -> list[Any] | None:
    if values is None:
        return target
    if not isinstance(values, list):
        raise Quarantined("bad_shape", f"{what} is {type(values).__name__}, expected a list")
    if target is None:
        target = []
    target.extend(values)
    return target


def join_chunks(chunks: list[Any]) -> dict[str, Any]:
    """One non-streamed response (``chat.completion`` or ``text_completion``) from a stream's chunks, with
    ``_truncated`` (choice indexes that never finished) and ``_bad`` (per-choice quarantine signals)."""
    if not chunks:
        raise Quarantined("truncated_stream", "the stream holds no chunks")
    first: dict[str, Any] | None = None
    choices: dict[int, _Choice] = {}
    prompt: Any = None
    bad: dict[int, Quarantined] = {}
    for position, chunk in enumerate(chunks):
        chunk = as_dict(chunk, f"chunk {position}")
        if chunk.get("error") is not None:
            raise Quarantined("upstream_error", f"the stream carried an error: {str(chunk['error'])[:300]}")
        if not is_chunk(chunk):
            raise Quarantined("bad_shape", f"chunk {position} is not a completion chunk")
        if first is None:
            first = chunk
        if prompt is None and chunk.get("prompt_token_ids") is not None:
            prompt = chunk["prompt_token_ids"]
        for choice in as_list(chunk.get("choices") or [], f"chunk {position} choices"):
            choice = as_dict(choice, f"chunk {position} choice")
            index = choice.get("index", 0)
            if type(index) is not int or index < 0:
                raise Quarantined("bad_shape", f"chunk {position} has a choice index {index!r}")
            state = choices.get(index)
            if state is None:
                state = choices[index] = _Choice(index)
            if index in bad:
                continue
            try:
                _add(state, choice)
            except Quarantined as q:
                q.choice_index = index
                bad[index] = q
    assert first is not None
    chat = first.get("object") != "text_completion"
    record = {k: v for k, v in first.items() if k not in ("choices", "object", "usage")}
    record["object"] = "chat.completion" if chat else "text_completion"
    if prompt is not None:
        record["prompt_token_ids"] = prompt
    joined = [_joined(c, chat) for i, c in sorted(choices.items()) if i not in bad]
    record["choices"] = joined
    record["_truncated"] = [c.index for c in choices.values() if c.finish is None and c.index not in bad]
    record["_bad"] = list(bad.values())
    return record


def _add(state: _Choice, choice: dict[str, Any]) -> None:
    delta = choice.get("delta")
    delta = delta if isinstance(delta, dict) else {}
    state.token_ids = _extend(state.token_ids, choice.get("token_ids", delta.get("token_ids")), "token_ids")
    if state.prompt is None and choice.get("prompt_token_ids") is not None:
        state.prompt = choice["prompt_token_ids"]
    text = delta.get("content") if "delta" in choice else choice.get("text")
    if isinstance(text, str):
        state.text.append(text)
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        state.lp_content = _extend(state.lp_content, logprobs.get("content"), "logprobs.content")
        state.lp_tokens = _extend(state.lp_tokens, logprobs.get("tokens"), "logprobs.tokens")
        state.lp_values = _extend(state.lp_values, logprobs.get("token_logprobs"), "logprobs.token_logprobs")
        state.lp_top = _extend(state.lp_top, logprobs.get("top_logprobs"), "logprobs.top_logprobs")
    elif logprobs is not None:
        raise Quarantined("bad_logprob", f"logprobs is {type(logprobs).__name__}, expected an object")
    if choice.get("finish_reason") is not None:
        state.finish = choice["finish_reason"]


def _joined(state: _Choice, chat: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"index": state.index, "finish_reason": state.finish}
    if state.token_ids is not None:
        out["token_ids"] = state.token_ids
    if state.prompt is not None:
        out["prompt_token_ids"] = state.prompt
    if chat:
        out["message"] = {"role": "assistant", "content": "".join(state.text)}
        if state.lp_content is not None:
            out["logprobs"] = {"content": state.lp_content}
    else:
        out["text"] = "".join(state.text)
        if state.lp_values is not None or state.lp_tokens is not None:
            out["logprobs"] = {
                "tokens": state.lp_tokens or [],
                "token_logprobs": state.lp_values or [],
                "top_logprobs": state.lp_top,
            }
    return out
