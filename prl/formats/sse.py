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

- :meth:`Sse.frame_blocks` (what ingest calls) frames whole blocks of the source: a stream laid out as
  servers write it (``data:`` lines each followed by one blank line, up to ``data: [DONE]``) is cut out with
  bytes searches, and the streams of a block are parsed together by Arrow's JSON reader and joined in bulk
  (:mod:`prl.formats.sse_arrow`). A stream that is not laid out so, or that the bulk join does not accept,
  goes the ways below, which give the same records and samples.
- :meth:`Sse.frame` keeps a stream's lines as bytes and decodes only the lines that could start a new stream:
  the first of each stream, and any line that does not begin with that stream's own ``{"id":"..."`` (with no
  other ``"id"`` key in it). Errors of the other lines surface from :meth:`Sse.parse`, with the reason and
  message the eager framer (:func:`frame_decoded`) gives them; :func:`resolve` turns a lazy record into
  the eager one where a caller needs every error up front.
- :meth:`Sse.parse` decodes the whole stream at once and joins it with
  :func:`prl.formats.sse_fast.join_chat_chunks` (C-level gathers over all chunks), falling back to
  :func:`join_chunks` (per chunk, exact) for streams outside the common chat shape, which explains them.

A stream cut before ``[DONE]``, or a choice that never got a ``finish_reason``, is ``truncated_stream``; an
``error`` object inside a stream is ``upstream_error``; an undecodable chunk makes the stream
``malformed_json``.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from operator import itemgetter
from typing import Any, ClassVar

import orjson

from prl.formats.base import Format, ParseOptions, Quarantined, RawRecord, Sample, decode_json
from prl.formats.fields import as_dict, as_list
from prl.formats.sse_arrow import UNJOINED, JoinedStream, join_streams, payloads
from prl.formats.sse_fast import join_chat_chunks, join_chat_parts
from prl.sources import lines_of

STREAM_KEY = "sse_chunks"
"""A decoded stream is ``{"sse_chunks": [chunk, ...], "sse_done": bool}`` (an undecodable chunk is None)."""
DONE_KEY = "sse_done"
LINES_KEY = "sse_lines"
"""A lazily framed stream is ``{"sse_lines": [line, ...], "sse_line_numbers": [int, ...], "sse_done": bool}``:
its ``data:`` lines (stripped, without ``[DONE]``) and their 1-based line numbers."""
LINE_NUMBERS_KEY = "sse_line_numbers"
TEXT_KEY = "sse_text"
"""A stream framed whole (:func:`_canonical_stream`) is ``{"sse_text": its bytes from its first line to its
[DONE], "sse_first_line": int, "sse_line_count": int, "sse_first_chunk": the first chunk decoded}``, plus
``"sse_rows"`` (its payloads as NDJSON) until the bulk join, which adds ``"sse_joined"``
(:class:`prl.formats.sse_arrow.JoinedStream`) where it succeeds."""
FIRST_LINE_KEY = "sse_first_line"
LINE_COUNT_KEY = "sse_line_count"
FIRST_KEY = "sse_first_chunk"
ROWS_KEY = "sse_rows"
JOINED_KEY = "sse_joined"
BULK_BYTES = 16 * 1024 * 1024
"""Source bytes of canonical streams joined in one bulk parse: large enough that the parse's fixed costs
and threads pay off, small enough to bound memory (a few times this)."""
CARRY_LIMIT = 32 * 1024 * 1024
"""Bytes after the last ``[DONE]`` of the blocks read so far, kept to frame whole with the next block; beyond
that (a longer stream, or no ``[DONE]`` at all) they go through the line framer instead."""

_SKIPPED_FIELDS = (b"event:", b"id:", b"retry:")
_ID_FIRST = re.compile(rb'data:[ \t]*\{[ \t]*"id"[ \t]*:[ \t]*"([^"\\]*)"')
"""A ``data:`` line whose chunk begins with a plain string ``id``: the prefix that later lines of the same
stream share."""
_NO_PREFIX = b" "
"""A prefix no stripped line starts with."""
_ID_ESCAPES = b"\\u006"
"""``\\u0069`` / ``\\u0064``: the only escaped spellings of the letters of an ``"id"`` key."""


def is_chunk(obj: Any) -> bool:
    """One streamed chunk: ``object`` ends with ``.chunk``, or a ``text_completion`` chunk (same ``object`` as
    the non-streamed response, told apart by living in a ``data:`` line)."""
    if not isinstance(obj, dict):
        return False
    kind = obj.get("object")
    return isinstance(kind, str) and (kind.endswith(".chunk") or kind == "text_completion")


def _decode(payload: bytes, line_no: int) -> tuple[Any, Quarantined | None]:
    """A chunk and None, or None and the ``malformed_json`` signal naming its line."""
    try:
        return orjson.loads(payload), None
    except (ValueError, RecursionError):  # orjson refused it: the standard library decides
        try:
            return decode_json(payload), None
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return None, Quarantined("malformed_json", f"line {line_no}: not valid JSON: {exc}")


def _payload(line: bytes) -> bytes:
    """The payload of a stripped ``data:`` line."""
    return line[5:].lstrip()


_AFTER_DATA = itemgetter(slice(5, None))


class _Stream:
    """The lines of one stream while it is being framed."""

    def __init__(self, line: int) -> None:
        self.line = line
        self.lines: list[bytes] = []
        self.numbers: list[int] = []
        self.stream_id: Any = None
        self.error: Quarantined | None = None
        self.prefix = _NO_PREFIX
        """The ``data: {"id":"<stream id>"`` bytes that prove a line belongs to this stream."""

    def add(self, line_no: int, line: bytes, chunk: Any, error: Quarantined | None) -> None:
        """Add a decoded line (the first of the stream, or one whose id had to be read)."""
        if not self.lines and error is not None:
            self.error = error  # the first line's error is the stream's first; later ones surface in parse
        self.lines.append(line)
        self.numbers.append(line_no)
        chunk_id = _chunk_id(chunk)
        if self.stream_id is None and isinstance(chunk_id, (str, int)):
            self.stream_id = chunk_id
            match = _ID_FIRST.match(line) if isinstance(chunk_id, str) else None
            if match is not None and match.group(1) == chunk_id.encode():
                self.prefix = line[: match.end()]

    def record(self, done_line: bytes | None) -> RawRecord:
        raw = self.lines if done_line is None else [*self.lines, done_line]
        obj = {LINES_KEY: self.lines, LINE_NUMBERS_KEY: self.numbers, DONE_KEY: done_line is not None}
        return RawRecord(self.line, b"\n".join(raw), obj, self.error)


def _chunk_id(chunk: Any) -> Any:
    return chunk.get("id") if type(chunk) is dict else None


class _LineFramer:
    """:meth:`Sse.frame` as a state machine fed lines in pieces: a stream may span two calls of :meth:`feed`."""

    def __init__(self) -> None:
        self.stream: _Stream | None = None

    @property
    def open(self) -> bool:
        """Whether a stream has begun and not yet ended."""
        return self.stream is not None

    def feed(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """The records that end within ``lines`` (numbered lines, without their newlines)."""
        stream = self.stream
        prefix = _NO_PREFIX if stream is None else stream.prefix  # the current stream's, once known
        after_prefix = len(prefix)
        add_line = add_number = list.append  # rebound to the current stream's lists
        if stream is not None:
            add_line, add_number = stream.lines.append, stream.numbers.append
        escapes = _ID_ESCAPES
        for line_no, raw in lines:
            if not raw:  # the blank line after every event
                continue
            line = raw.strip()
            if line.startswith(prefix) and line.find(b'"id"', after_prefix) < 0 and escapes not in line:
                # its id, if it decodes at all, is the stream's: it cannot start a new stream
                add_line(line)
                add_number(line_no)
                continue
            if line[:5] != b"data:":
                if not line or line[:1] == b":" or line.startswith(_SKIPPED_FIELDS):
                    continue
                yield RawRecord(line_no, raw, None, Quarantined("malformed_sse", "line is not an SSE 'data:' field"))
                continue
            payload = _payload(line)
            if payload == b"[DONE]":
                if stream is not None:
                    self.stream = None
                    yield stream.record(line)
                    stream, prefix, after_prefix = None, _NO_PREFIX, len(_NO_PREFIX)
                continue
            chunk, error = _decode(payload, line_no)
            chunk_id = _chunk_id(chunk)
            if (
                stream is not None
                and chunk_id is not None
                and stream.stream_id is not None
                and chunk_id != stream.stream_id
            ):
                self.stream = None
                yield stream.record(None)
                stream = None
            if stream is None:
                stream = self.stream = _Stream(line_no)
                add_line, add_number = stream.lines.append, stream.numbers.append
            stream.add(line_no, line, chunk, error)
            prefix = stream.prefix
            after_prefix = len(prefix)

    def finish(self) -> Iterator[RawRecord]:
        """The stream still open at the end of the source (cut before its ``[DONE]``), if any."""
        if self.stream is not None:
            stream, self.stream = self.stream, None
            yield stream.record(None)


_DONE_LINE = b"data: [DONE]\n"


def _done_line_ends(text: bytes) -> Iterator[int]:
    """The offsets just past each ``data: [DONE]`` line of ``text`` (whole lines) written exactly so, and past
    the blank line after it when there is one."""
    at = text.find(_DONE_LINE)
    while at >= 0:
        end = at + len(_DONE_LINE)
        if at == 0 or text[at - 1] == 0x0A:  # the whole line, not the end of a longer one
            yield end + 1 if text[end : end + 1] == b"\n" else end
        at = text.find(_DONE_LINE, end)


_STREAM_END = b"\n\n" + _DONE_LINE


def _canonical_stream(segment: bytes, line_no: int, newlines: int) -> RawRecord | None:
    """A stream written as servers write it, as a record to be judged in bulk (:class:`_BulkJoin`); None
    when ``segment`` is laid out otherwise (the line framer then frames it).

    ``segment`` holds whole lines numbered from ``line_no`` (``newlines`` of them) and ends with a
    ``data: [DONE]`` line, or that line and a blank one. The canonical layout is blank lines, then ``data:``
    lines, each followed by one blank line, the first a chunk whose ``id`` is a string, then the
    ``[DONE]``. The record holds the first chunk decoded and the NDJSON of the payloads; its ``raw`` is the
    stream's bytes as they are, blank lines included, from its first line."""
    body = segment.lstrip(b"\n")
    blank_lines = len(segment) - len(body)
    line_no += blank_lines
    trailing = 1 if body.endswith(b"\n\n") else 0
    count, odd = divmod(newlines - blank_lines - 1 - trailing, 2)  # data lines, each followed by a blank one
    if odd or count < 1 or not body.endswith(_STREAM_END, 0, len(body) - trailing):
        return None
    first = body[: body.find(b"\n")]
    chunk, error = _decode(_payload(first), line_no)
    stream_id = _chunk_id(chunk)
    if error is not None or type(stream_id) is not str or first != first.strip():
        return None
    rows = payloads(body, count, trailing, stream_id)
    if rows is None:
        return None
    obj = {TEXT_KEY: body, FIRST_LINE_KEY: line_no, LINE_COUNT_KEY: count, FIRST_KEY: chunk, ROWS_KEY: rows}
    return RawRecord(line_no, body, obj)


def _with_lines(obj: dict[str, Any]) -> dict[str, Any]:
    """A canonical stream's record in the line framer's form: its (stripped) lines, their numbers, and its
    ``[DONE]``."""
    text = obj[TEXT_KEY]
    lines = list(map(bytes.strip, text[: text.rfind(_STREAM_END)].split(b"\n\n")))
    first = obj[FIRST_LINE_KEY]
    return {LINES_KEY: lines, LINE_NUMBERS_KEY: list(range(first, first + 2 * len(lines), 2)), DONE_KEY: True}


class _BulkJoin:
    """The bulk join of one batch of records (:func:`_canonical_stream` records among others), running on a
    worker thread (Arrow's parse releases the GIL) while the next batch is framed."""

    def __init__(self, records: list[RawRecord], pool: ThreadPoolExecutor) -> None:
        self.records = records
        self.bulk = [r for r in records if type(r.obj) is dict and ROWS_KEY in r.obj]
        rows = [r.obj.pop(ROWS_KEY) for r in self.bulk]
        counts = [r.obj[LINE_COUNT_KEY] for r in self.bulk]
        self.verdicts = pool.submit(join_streams, rows, counts) if self.bulk else None

    def result(self) -> Iterator[RawRecord]:
        """The records, in order, with each canonical stream joined, left to be joined chunk by chunk, or,
        when its lines may not be one stream, replaced by the records the line framer makes of them."""
        if self.verdicts is None:
            yield from self.records
            return
        judged = dict(zip(map(id, self.bulk), self.verdicts.result()))
        for record in self.records:
            verdict = judged.get(id(record), UNJOINED)
            if verdict is None:
                yield from Sse().frame(lines_of([(record.line, record.raw)]))
                continue
            if isinstance(verdict, JoinedStream):
                record.obj[JOINED_KEY] = verdict
            yield record


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
        framer = _LineFramer()
        yield from framer.feed(lines)
        yield from framer.finish()

    def frame_blocks(self, blocks: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """The records :meth:`frame` gives for the same lines, with streams in the canonical layout framed
        whole (see :func:`_canonical_stream`) rather than line by line, and joined in bulk
        (:class:`_BulkJoin`) about :data:`BULK_BYTES` at a time, each batch on a worker thread while the
        next is framed."""
        with ThreadPoolExecutor(1, thread_name_prefix="prl-sse-join") as pool:
            joining: _BulkJoin | None = None  # the batch before, on (or queued for) the worker thread
            for batch in self._batches(blocks):
                queued = _BulkJoin(batch, pool)  # joined while the batch before is read
                if joining is not None:
                    yield from joining.result()
                joining = queued
            if joining is not None:
                yield from joining.result()

    def _batches(self, blocks: Iterable[tuple[int, bytes]]) -> Iterator[list[RawRecord]]:
        """Records in source order, in batches holding about :data:`BULK_BYTES` of canonical streams."""
        framer = _LineFramer()
        pending: list[tuple[int, bytes]] = []  # whole lines after the last [DONE] so far, with their line numbers
        pending_bytes = 0
        out: list[RawRecord] = []
        waiting = 0  # bytes of the canonical streams in out
        for first, block in blocks:
            if b"\r" in block:  # lines to strip: the line framer does it exactly
                out.extend(framer.feed(lines_of([*pending, (first, block)])))
                pending, pending_bytes = [], 0
                continue
            start, line_no = 0, (pending[0][0] if pending else first)
            for end in _done_line_ends(block):
                segment = block[start:end]
                if pending:
                    segment = b"".join([*(part for _, part in pending), segment])
                    pending, pending_bytes = [], 0
                newlines = segment.count(b"\n")
                record = None if framer.open else _canonical_stream(segment, line_no, newlines)
                if record is not None:
                    out.append(record)
                    waiting += len(segment)
                else:
                    out.extend(framer.feed(lines_of([(line_no, segment)])))
                line_no += newlines
                start = end
            if start < len(block):
                pending.append((line_no if start else first, block[start:]))
                pending_bytes += len(block) - start
                if framer.open or pending_bytes > CARRY_LIMIT:
                    out.extend(framer.feed(lines_of(pending)))
                    pending, pending_bytes = [], 0
            if waiting >= BULK_BYTES:
                yield out
                out, waiting = [], 0
        out.extend(framer.feed(lines_of(pending)))
        out.extend(framer.finish())
        yield out

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        if is_chunk(obj):
            obj = {STREAM_KEY: [obj], DONE_KEY: False}
        obj = as_dict(obj, "stream")
        if TEXT_KEY in obj:
            joined = obj.get(JOINED_KEY)
            if isinstance(joined, JoinedStream) and type(obj.get(FIRST_KEY)) is dict:
                return read_joined(_bulk_record(obj[FIRST_KEY], joined), options)
            obj = _with_lines(obj)
        if LINES_KEY in obj:
            return _parse_lines(obj, options)
        chunks = as_list(obj.get(STREAM_KEY), "stream chunks")
        if not obj.get(DONE_KEY):
            raise Quarantined("truncated_stream", "the stream ended before 'data: [DONE]'")
        return parse_chunks(chunks, options)


def _parse_lines(obj: dict[str, Any], options: ParseOptions) -> list[Sample | Quarantined]:
    """Decode, join and read a lazily framed stream with the cyclic garbage collector paused.

    A stream's decoded chunks are many small, acyclic containers that live only while the stream is joined;
    left running, the collector would traverse them again and again as they age, costing about as much as
    decoding them. They are freed (by reference counting, when :func:`_join_lines` returns or its signal's
    traceback is dropped) before the collector resumes, so it never sees them. Its previous state is kept."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _join_lines(obj, options)
    except Quarantined as q:
        raise q.with_traceback(None) from None  # drop the frames that hold the chunks
    finally:
        if enabled:
            gc.enable()


def _join_lines(obj: dict[str, Any], options: ParseOptions) -> list[Sample | Quarantined]:
    parts = _decoded_parts(obj.get(LINES_KEY))
    if parts is not None:
        if not obj.get(DONE_KEY):
            raise Quarantined("truncated_stream", "the stream ended before 'data: [DONE]'")
        record = join_chat_parts(*parts)
        if record is not None:
            return read_joined(record, options)
    chunks = _decoded_lines(obj)
    if not obj.get(DONE_KEY):
        raise Quarantined("truncated_stream", "the stream ended before 'data: [DONE]'")
    return parse_chunks(chunks, options)


def _bulk_record(first: dict[str, Any], joined: JoinedStream) -> dict[str, Any]:
    """The joined ``chat.completion`` record (as :func:`prl.formats.sse_fast.join_chat_parts` shapes it) of
    a stream joined in bulk, its lists as Arrow arrays; ``first`` is its first chunk."""
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


_CHOICES_KEY = b'"choices":'


def _decoded_parts(lines: Any) -> tuple[list[Any], list[Any]] | None:
    """``(heads, choice lists)`` of a stream whose lines after the first all begin with the same bytes up to
    their top-level ``"choices":`` and end with the ``}`` closing the chunk, as servers write them (id,
    object, created and model repeat in every chunk): those bytes are decoded once (as the shared head) and
    each line only from there on. The first line is decoded whole. None when the lines are not like that or
    one does not decode; the stream is then decoded line by line.

    A line that is ``prefix + V + "}"``, with ``prefix + "0}"`` a JSON object and ``V`` a JSON value, is the
    object ``prefix + "0}"`` with ``choices`` set to ``V``: the same chunk a whole decode gives."""
    if type(lines) is not list or len(lines) < 2 or not set(map(type, lines)) <= {bytes}:
        return None
    end = lines[1].find(_CHOICES_KEY)
    if end < 0:
        return None
    prefix = lines[1][: end + len(_CHOICES_KEY)]
    rest = lines[1:]
    if not (all(map(bytes.startswith, rest, repeat(prefix))) and all(map(bytes.endswith, rest, repeat(b"}")))):
        return None
    try:
        head = orjson.loads(prefix[5:] + b"0}")
        first = orjson.loads(lines[0][5:])
        choice_lists = list(map(orjson.loads, map(itemgetter(slice(len(prefix), -1)), rest)))
    except (ValueError, RecursionError):
        return None
    first_choices = first.get("choices") if type(first) is dict else None
    return [first, *repeat(head, len(rest))], [first_choices, *choice_lists]


def _decoded_lines(obj: dict[str, Any]) -> list[Any]:
    """Every chunk of a lazily framed stream, decoded in one pass; the first undecodable one raises its
    ``malformed_json`` signal (the error the eager framer records for the stream)."""
    lines = as_list(obj.get(LINES_KEY), "stream lines")
    numbers = as_list(obj.get(LINE_NUMBERS_KEY), "stream line numbers")
    if len(numbers) != len(lines) or not set(map(type, lines)) <= {bytes} or not set(map(type, numbers)) <= {int}:
        raise Quarantined("bad_shape", "a framed stream holds lines that are not bytes with their line numbers")
    try:  # JSON ignores the blanks after "data:" that _payload strips, unless they are not JSON blanks
        return list(map(orjson.loads, map(_AFTER_DATA, lines)))
    except (ValueError, RecursionError):
        pass  # some line needs the standard library, other blanks stripped, or is malformed: line by line
    chunks = []
    for line, line_no in zip(lines, numbers):
        chunk, error = _decode(_payload(line), line_no)
        if error is not None:
            raise error
        chunks.append(chunk)
    return chunks


def resolve(record: RawRecord) -> RawRecord:
    """The record :func:`frame_decoded` gives for the same lines: every chunk decoded (None where it is
    not JSON) and the stream's first decoding error as the record's error."""
    obj = record.obj
    if isinstance(obj, dict) and TEXT_KEY in obj:
        obj = _with_lines(obj)
    if not (isinstance(obj, dict) and LINES_KEY in obj):
        return record
    chunks: list[Any] = []
    error = record.error
    for line, line_no in zip(obj[LINES_KEY], obj[LINE_NUMBERS_KEY]):
        chunk, problem = _decode(_payload(line), line_no)
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
    """Samples of one complete stream, given its decoded chunks in order: joined by
    :func:`prl.formats.sse_fast.join_chat_chunks` when the stream is in the common chat shape, else by
    :func:`join_chunks`, which explains what is wrong with it."""
    record = join_chat_chunks(chunks)
    if record is None:
        record = join_chunks(chunks)
    return read_joined(record, options)


def read_joined(record: dict[str, Any], options: ParseOptions) -> list[Sample | Quarantined]:
    """Samples of a joined stream (:func:`join_chunks`'s shape): its per-choice signals, then what the
    non-streamed reader makes of it, with choices that never finished as ``truncated_stream``."""
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
