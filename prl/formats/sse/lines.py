"""SSE line framing: numbered lines of a capture → one record per stream, decoding as little as it can.

:class:`LineFramer` keeps a stream's lines as bytes and decodes only the lines that could start a new stream:
the first of each stream, and any line that does not begin with that stream's own ``{"id":"..."`` (with no
other ``"id"`` key in it). A new chunk ``id`` without a ``[DONE]`` before it starts a new stream; ``[DONE]``
closes one. It is a state machine fed lines in pieces, so a stream may span pieces.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from prl.formats.base import Quarantined, RawRecord, decode_json

STREAM_KEY = "sse_chunks"
"""A decoded stream is ``{"sse_chunks": [chunk, ...], "sse_done": bool}`` (an undecodable chunk is None)."""
DONE_KEY = "sse_done"
LINES_KEY = "sse_lines"
"""A lazily framed stream is ``{"sse_lines": [line, ...], "sse_line_numbers": [int, ...], "sse_done": bool}``:
its ``data:`` lines (stripped, without ``[DONE]``) and their 1-based line numbers."""
LINE_NUMBERS_KEY = "sse_line_numbers"
_SKIPPED_FIELDS = (b"event:", b"id:", b"retry:")
_ID_FIRST = re.compile(rb'data:[ \t]*\{[ \t]*"id"[ \t]*:[ \t]*"([^"\\]*)"')
"""A ``data:`` line whose chunk begins with a plain string ``id``: the prefix that later lines of the same
stream share."""
_NO_PREFIX = b" "
"""A prefix no stripped line starts with."""
_ID_ESCAPES = b"\\u006"
"""``\\u0069`` / ``\\u0064``: the only escaped spellings of the letters of an ``"id"`` key."""


def decode_chunk(payload: bytes, line_no: int) -> tuple[Any, Quarantined | None]:
    """A chunk and None, or None and the ``malformed_json`` signal naming its line."""
    try:
        return decode_json(payload), None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return None, Quarantined("malformed_json", f"line {line_no}: not valid JSON: {exc}")


def payload_of(line: bytes) -> bytes:
    """The payload of a stripped ``data:`` line."""
    return line[5:].lstrip()


class _Stream:
    """The lines of one stream while it is being framed."""

    def __init__(self, line: int) -> None:
        self.line = line
        self.lines: list[bytes] = []
        self.numbers: list[int] = []
        self.stream_id: Any = None
        self.error: Quarantined | None = None
        self.nbytes = 0
        """Source bytes from the stream's first line up to the last line fed (newlines included)."""
        self.prefix = _NO_PREFIX
        """The ``data: {"id":"<stream id>"`` bytes that prove a line belongs to this stream."""

    def add(self, line_no: int, line: bytes, chunk: Any, error: Quarantined | None) -> None:
        """Add a decoded line (the first of the stream, or one whose id had to be read)."""
        if not self.lines and error is not None:
            self.error = error  # the first line's error is the stream's first; later ones surface in parse
        self.lines.append(line)
        self.numbers.append(line_no)
        chunk_id = id_of_chunk(chunk)
        if self.stream_id is None and isinstance(chunk_id, (str, int)):
            self.stream_id = chunk_id
            match = _ID_FIRST.match(line) if isinstance(chunk_id, str) else None
            if match is not None and match.group(1) == chunk_id.encode("utf-8", "surrogatepass"):  # type: ignore[union-attr]
                self.prefix = line[: match.end()]

    def record(self, done_line: bytes | None) -> RawRecord:
        raw = self.lines if done_line is None else [*self.lines, done_line]
        obj = {LINES_KEY: self.lines, LINE_NUMBERS_KEY: self.numbers, DONE_KEY: done_line is not None}
        return RawRecord(self.line, b"\n".join(raw), obj, self.error)


def id_of_chunk(chunk: Any) -> Any:
    return chunk.get("id") if type(chunk) is dict else None


class LineFramer:
    """The line framer, a state machine fed lines in pieces: a stream may span two calls of :meth:`feed`."""

    def __init__(self) -> None:
        self.stream: _Stream | None = None

    @property
    def open(self) -> bool:
        """Whether a stream has begun and not yet ended."""
        return self.stream is not None

    def feed(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """The records that end within ``lines`` (numbered lines, without their newlines; a ``\\r`` left at the
        end of a line counts in the stream's :attr:`_Stream.nbytes` and is otherwise ignored)."""
        stream = self.stream
        prefix = _NO_PREFIX if stream is None else stream.prefix  # the current stream's, once known
        after_prefix = len(prefix)
        add_line = add_number = list.append  # rebound to the current stream's lists
        if stream is not None:
            add_line, add_number = stream.lines.append, stream.numbers.append  # type: ignore[assignment]
        escapes = _ID_ESCAPES
        size = 0  # bytes of the lines fed while the current stream was open, not yet added to its nbytes
        for line_no, raw in lines:
            size += len(raw) + 1
            if not raw:  # the blank line after every event
                continue
            line = raw.strip()
            if line.startswith(prefix) and line.find(b'"id"', after_prefix) < 0 and escapes not in line:
                # its id, if it decodes at all, is the stream's: it cannot start a new stream
                add_line(line)  # type: ignore[arg-type, call-arg]
                add_number(line_no)  # type: ignore[arg-type, call-arg]
                continue
            if line[:5] != b"data:":
                if not line or line[:1] == b":" or line.startswith(_SKIPPED_FIELDS):
                    continue
                bad = raw.rstrip(b"\r")
                yield RawRecord(line_no, bad, None, Quarantined("malformed_sse", "line is not an SSE 'data:' field"))
                continue
            payload = payload_of(line)
            if payload == b"[DONE]":
                if stream is not None:
                    self.stream = None
                    yield stream.record(line)
                    stream, prefix, after_prefix = None, _NO_PREFIX, len(_NO_PREFIX)
                size = 0
                continue
            chunk, error = decode_chunk(payload, line_no)
            chunk_id = id_of_chunk(chunk)
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
                add_line, add_number = stream.lines.append, stream.numbers.append  # type: ignore[assignment]
                size = len(raw) + 1  # what came before the stream's first line is not the stream's
            stream.add(line_no, line, chunk, error)
            prefix = stream.prefix
            after_prefix = len(prefix)
        if stream is not None:
            stream.nbytes += size

    def finish(self) -> Iterator[RawRecord]:
        """The stream still open at the end of the source (cut before its ``[DONE]``), if any, with the bytes of
        its lines fed as :attr:`RawRecord.unfinished`."""
        if self.stream is not None:
            stream, self.stream = self.stream, None
            record = stream.record(None)
            record.unfinished = stream.nbytes
            yield record
