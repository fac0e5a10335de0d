"""Server-sent-event stream captures: ``data: {...}`` lines of ``chat.completion.chunk`` or streamed
``text_completion`` objects, ``data: [DONE]`` closing each stream, many streams back to back in one file
(blank lines, ``: comments`` and ``event:``/``id:``/``retry:`` fields between them are ignored).

:meth:`Sse.frame` turns lines into one record per stream (its line number is the stream's first line; a new
chunk ``id`` without a ``[DONE]`` before it starts a new stream). :meth:`Sse.parse` joins each choice's chunks
into the non-streamed response shape (token IDs, ``logprobs.content`` entries, legacy ``tokens`` /
``token_logprobs`` / ``top_logprobs``, text, the last ``finish_reason``; prompt IDs from the first chunk that
has them) and hands it to the matching reader in :mod:`prl.formats.vllm`, so a streamed and a non-streamed
response of the same request give the same sample. Joining is ``list.extend`` per chunk (a C-level copy) and
the joined lists go to Arrow in one conversion each: no per-token Python.

A stream cut before ``[DONE]``, or a choice that never got a ``finish_reason``, is ``truncated_stream``; an
``error`` object inside a stream is ``upstream_error``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from prl.formats.base import Format, ParseOptions, Quarantined, RawRecord, Sample, decode_json
from prl.formats.fields import as_dict, as_list

STREAM_KEY = "sse_chunks"
"""A framed stream is ``{"sse_chunks": [chunk, ...], "sse_done": bool}``."""
DONE_KEY = "sse_done"

_SKIPPED_FIELDS = (b"event:", b"id:", b"retry:")


def is_chunk(obj: Any) -> bool:
    """One streamed chunk: ``object`` ends with ``.chunk``, or a ``text_completion`` chunk (same ``object`` as
    the non-streamed response, told apart by living in a ``data:`` line)."""
    if not isinstance(obj, dict):
        return False
    kind = obj.get("object")
    return isinstance(kind, str) and (kind.endswith(".chunk") or kind == "text_completion")


class _Stream:
    def __init__(self, line: int) -> None:
        self.line = line
        self.raw: list[bytes] = []
        self.chunks: list[Any] = []
        self.stream_id: Any = None
        self.error: Quarantined | None = None

    def record(self, done: bool) -> RawRecord:
        obj = {STREAM_KEY: self.chunks, DONE_KEY: done}
        return RawRecord(self.line, b"\n".join(self.raw), obj, self.error)


class Sse(Format):
    """SSE stream captures of OpenAI-style chat or completions streams (vLLM, SGLang, proxies)."""

    name: ClassVar[str] = "sse"
    description: ClassVar[str] = "SSE stream captures: data: {...chunk} lines ending in data: [DONE]"

    def detect(self, obj: Any) -> bool:
        return (isinstance(obj, dict) and isinstance(obj.get(STREAM_KEY), list)) or is_chunk(obj)

    def sniff(self, head: list[RawRecord]) -> bool:
        return any(
            r.error is None and isinstance(r.obj, dict) and any(is_chunk(c) for c in r.obj.get(STREAM_KEY, [])[:1])
            for r in head
        )

    def frame(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        stream: _Stream | None = None
        for line_no, raw in lines:
            line = raw.strip()
            if not line or line.startswith(b":") or line.startswith(_SKIPPED_FIELDS):
                continue
            if not line.startswith(b"data:"):
                yield RawRecord(line_no, raw, None, Quarantined("malformed_sse", "line is not an SSE 'data:' field"))
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                if stream is not None:
                    stream.raw.append(line)
                    yield stream.record(done=True)
                    stream = None
                continue
            try:
                chunk = decode_json(payload)
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                chunk, error = None, Quarantined("malformed_json", f"line {line_no}: not valid JSON: {exc}")
            else:
                error = None
            chunk_id = chunk.get("id") if isinstance(chunk, dict) else None
            if (
                stream is not None
                and chunk_id is not None
                and stream.stream_id is not None
                and chunk_id != stream.stream_id
            ):
                yield stream.record(done=False)
                stream = None
            if stream is None:
                stream = _Stream(line_no)
            if stream.stream_id is None and isinstance(chunk_id, (str, int)):
                stream.stream_id = chunk_id
            stream.raw.append(line)
            stream.chunks.append(chunk)
            if error is not None and stream.error is None:
                stream.error = error
        if stream is not None:
            yield stream.record(done=False)

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        if is_chunk(obj):
            obj = {STREAM_KEY: [obj], DONE_KEY: False}
        obj = as_dict(obj, "stream")
        chunks = as_list(obj.get(STREAM_KEY), "stream chunks")
        if not obj.get(DONE_KEY):
            raise Quarantined("truncated_stream", "the stream ended before 'data: [DONE]'")
        return parse_chunks(chunks, options)


def parse_chunks(chunks: list[Any], options: ParseOptions) -> list[Sample | Quarantined]:
    """Samples of one complete stream, given its decoded chunks in order."""
    record = join_chunks(chunks)
    from prl.formats.vllm import VllmChat, VllmCompletions

    reader = VllmChat() if record["object"] == "chat.completion" else VllmCompletions()
    out: list[Sample | Quarantined] = []
    truncated = set(record.pop("_truncated"))
    for q in record.pop("_bad"):
        out.append(q)
    if record["choices"]:
        out.extend(reader.parse(record, options))
    message = "the stream ended without a finish_reason for this choice"
    for position, item in enumerate(out):
        if isinstance(item, Quarantined) and item.choice_index in truncated:
            item.reason, item.message = "truncated_stream", message
        elif isinstance(item, Sample) and item.choice_index in truncated:
            out[position] = Quarantined("truncated_stream", message, item.choice_index)
    return out


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
