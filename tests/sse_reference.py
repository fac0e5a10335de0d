"""The eager SSE reader the lazy and bulk paths must agree with: the eager framer (every chunk decoded while
framing) and the per-chunk join, kept here as the reference for equivalence tests.

:func:`reference_items` and :func:`lazy_items` give what ingest would see for a list of numbered lines:
``(line, item)`` pairs where an item is a :func:`sample_key` tuple or ``(reason, message, choice_index)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from prl.formats.base import ParseOptions, Quarantined, RawRecord, Sample, decode_json
from prl.formats.sse.exact import DONE_KEY, STREAM_KEY, Sse

_SKIPPED_FIELDS = (b"event:", b"id:", b"retry:")


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


def reference_frame(lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
    """One record per stream, every chunk decoded, the stream's first decoding error as its error."""
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


def sample_key(sample: Sample) -> tuple:
    """Every field of a sample, Arrow arrays as (type, repr of values) so NaN equals NaN."""
    out = []
    for f in dataclasses.fields(sample):
        value = getattr(sample, f.name)
        if isinstance(value, pa.Array):
            value = (str(value.type), repr(value.to_pylist()))
        out.append((f.name, value))
    return tuple(out)


def item_key(item: Sample | Quarantined) -> tuple:
    if isinstance(item, Quarantined):
        return (item.reason, item.message, item.choice_index)
    return sample_key(item)


def _items(records: Iterable[RawRecord], options: ParseOptions) -> list[tuple[int, tuple]]:
    fmt = Sse()
    out = []
    for record in records:
        if record.error is not None:
            out.append((record.line, item_key(record.error)))
            continue
        try:
            parsed = fmt.parse(record.obj, options)
        except Quarantined as q:
            out.append((record.line, item_key(q)))
            continue
        out.extend((record.line, item_key(item)) for item in parsed)
    return out


def reference_items(lines: list[tuple[int, bytes]], options: ParseOptions | None = None) -> list[tuple[int, tuple]]:
    """What the eager framer and the per-chunk join make of ``lines``."""
    return _items(reference_frame(iter(lines)), options or ParseOptions())


def lazy_items(lines: list[tuple[int, bytes]], options: ParseOptions | None = None) -> list[tuple[int, tuple]]:
    """What :class:`prl.formats.sse.exact.Sse` makes of ``lines``, as ingest calls it."""
    return _items(Sse().frame(iter(lines)), options or ParseOptions())


def as_blocks(
    lines: list[tuple[int, bytes]], cuts: Iterable[int] = (), terminated: bool = True
) -> list[tuple[int, bytes]]:
    """``lines`` (numbered 1, 2, …) as :meth:`prl.io.sources.LineReader.blocks` would give them: whole lines,
    a new block after each line position in ``cuts``; the last line without its newline unless
    ``terminated``."""
    blocks: list[tuple[int, bytes]] = []
    current: list[bytes] = []
    first = 1
    cut_after = set(cuts)
    for position, (_, line) in enumerate(lines, start=1):
        current.append(line + b"\n")
        if position in cut_after or position == len(lines):
            blocks.append((first, b"".join(current)))
            first, current = position + 1, []
    if blocks and not terminated:
        blocks[-1] = (blocks[-1][0], blocks[-1][1][:-1])
    return blocks


def block_items(
    lines: list[tuple[int, bytes]], cuts: Iterable[int] = (), options: ParseOptions | None = None
) -> list[tuple[int, tuple]]:
    """What :meth:`prl.formats.sse.exact.Sse.frame_blocks` (as ingest calls it) makes of ``lines`` cut into blocks."""
    return _items(Sse().frame_blocks(as_blocks(lines, cuts)), options or ParseOptions())
