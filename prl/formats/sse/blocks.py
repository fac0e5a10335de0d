"""SSE block framing: whole blocks of a capture → one record per stream, with streams in the servers' layout
cut out by bytes searches and joined in bulk by Arrow (:mod:`prl.formats.sse.bulk`) on a worker thread.

A stream laid out as servers write it (``data: {…}`` lines each followed by one blank line, up to
``data: [DONE]``) becomes a record holding its bytes, its first chunk decoded and the NDJSON of its
payloads; batches of such records are judged together. Anything else (other layouts, CRLF, a stream the
bulk join does not accept, lines that may belong to another stream) goes through the line framer
(:mod:`prl.formats.sse.lines`), so the records and samples are the ones it gives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prl.formats.base import RawRecord
from prl.formats.sse.bulk import UNJOINED, JoinedStream, join_streams, payloads
from prl.formats.sse.lines import (
    DONE_KEY,
    LINE_NUMBERS_KEY,
    LINES_KEY,
    LineFramer,
    decode_chunk,
    id_of_chunk,
    payload_of,
)
from prl.io.sources import lines_of

TEXT_KEY = "sse_text"
"""A stream framed whole (:func:`_canonical_stream`) is ``{"sse_text": its bytes from its first line to its
[DONE], "sse_first_line": int, "sse_line_count": int, "sse_first_chunk": the first chunk decoded}``, plus
``"sse_rows"`` (its payloads as NDJSON) until the bulk join, which adds ``"sse_joined"``
(:class:`prl.formats.sse.bulk.JoinedStream`) where it succeeds."""
FIRST_LINE_KEY = "sse_first_line"
LINE_COUNT_KEY = "sse_line_count"
FIRST_KEY = "sse_first_chunk"
ROWS_KEY = "sse_rows"
JOINED_KEY = "sse_joined"
BULK_BYTES = 16 * 1024 * 1024
"""Source bytes framed into one batch, whose canonical streams are joined in one bulk parse: large enough
that the parse's fixed costs and threads pay off, small enough to bound memory (a few times this)."""
CARRY_LIMIT = 32 * 1024 * 1024
"""Bytes after the last ``[DONE]`` of the blocks read so far, kept to frame whole with the next block; beyond
that (a longer stream, or no ``[DONE]`` at all) they go through the line framer instead."""

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
    chunk, error = decode_chunk(payload_of(first), line_no)
    stream_id = id_of_chunk(chunk)
    if error is not None or type(stream_id) is not str or first != first.strip():
        return None
    rows = payloads(body, count, trailing, stream_id)
    if rows is None:
        return None
    obj = {TEXT_KEY: body, FIRST_LINE_KEY: line_no, LINE_COUNT_KEY: count, FIRST_KEY: chunk, ROWS_KEY: rows}
    return RawRecord(line_no, body, obj)


def with_lines(obj: dict[str, Any]) -> dict[str, Any]:
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
                framer = LineFramer()
                yield from framer.feed(lines_of([(record.line, record.raw)]))
                yield from framer.finish()
                continue
            if isinstance(verdict, JoinedStream):
                record.obj[JOINED_KEY] = verdict
            yield record


def frame_blocks(blocks: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
    """The records :class:`LineFramer` gives for the lines of ``blocks`` (as
    :meth:`prl.io.sources.LineReader.blocks` yields them), with streams in the canonical layout framed
    whole (see :func:`_canonical_stream`) rather than line by line, and joined in bulk
    (:class:`_BulkJoin`) about :data:`BULK_BYTES` at a time, each batch on a worker thread while the
    next is framed."""
    with ThreadPoolExecutor(1, thread_name_prefix="prl-sse-join") as pool:
        joining: _BulkJoin | None = None  # the batch before, on (or queued for) the worker thread
        for batch in _batches(blocks):
            queued = _BulkJoin(batch, pool)  # joined while the batch before is read
            if joining is not None:
                yield from joining.result()
            joining = queued
        if joining is not None:
            yield from joining.result()


def _batches(blocks: Iterable[tuple[int, bytes]]) -> Iterator[list[RawRecord]]:
    """Records in source order, in batches framed from about :data:`BULK_BYTES` of the source each (whatever
    framed them, so that memory stays bounded by a batch)."""
    framer = LineFramer()
    pending: list[tuple[int, bytes]] = []  # whole lines after the last [DONE] so far, with their line numbers
    pending_bytes = 0
    out: list[RawRecord] = []
    held = 0  # source bytes framed into out
    for first, block in blocks:
        if b"\r" in block:  # lines to strip: the line framer does it exactly
            out.extend(framer.feed(lines_of([*pending, (first, block)], strip_cr=False)))
            held += pending_bytes + len(block)
            pending, pending_bytes = [], 0
        else:
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
                else:
                    out.extend(framer.feed(lines_of([(line_no, segment)], strip_cr=False)))
                held += len(segment)
                line_no += newlines
                start = end
            if start < len(block):
                pending.append((line_no if start else first, block[start:]))
                pending_bytes += len(block) - start
                if framer.open or pending_bytes > CARRY_LIMIT:
                    out.extend(framer.feed(lines_of(pending, strip_cr=False)))
                    held += pending_bytes
                    pending, pending_bytes = [], 0
        if held >= BULK_BYTES:
            yield out
            out, held = [], 0
    out.extend(framer.feed(lines_of(pending, strip_cr=False)))
    out.extend(framer.finish())
    yield out
