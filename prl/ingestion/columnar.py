"""The columnar road of ``prl ingest``: chat and text completions of the common shape read a block at a time, with no
Python object per record (a record naming a session, metadata, messages, a version or an agent is decoded for
those fields alone; its token lists stay Arrow's).

:func:`framed_items` frames a JSON-lines source as its format would, block by block: each block is read by one
Arrow call (:mod:`prl.ingestion.chat_block`), its records' rows computed and validated over the whole block
(:mod:`prl.ingestion.chat_rows`), and the records taken come out as :class:`ColumnarRun` (consecutive lines,
their ``traces`` rows ready); every other line comes out as the :class:`prl.formats.base.RawRecord` the
format's framing gives, for the per-record road. Items come in source order, so rows, quarantine rows and
batches are those of reading every record on the per-record road.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from prl.formats.base import Format, ParseOptions, RawRecord, Sample, decode_json
from prl.formats.guard import apply_options, check_sample
from prl.formats.registry import PerRecord
from prl.formats.vllm import VllmChat, VllmCompletions
from prl.ingestion.chat_block import BlockLines, ParsedBlock, parse_block
from prl.ingestion.chat_rows import CHAT_OBJECT, TEXT_OBJECT, ChatRows, chat_rows
from prl.io.sources import lines_of

POOR_BLOCKS = 2
"""Blocks in a row of which Arrow reads less than half the lines after which the rest of the source is framed
line by line (records of a shape the road does not take, such as records with top-k heads)."""


@dataclass(slots=True)
class ColumnarRun:
    """Records on consecutive lines of one block, taken by the columnar road. ``batch``: their ``traces`` rows
    (every choice of every record, in order); ``record`` int64[R]: each row's record (0..N-1); ``lines``
    int64[N]: the records' block line indices in ``block``; ``first_line``: the block's first line number;
    ``tokens`` int64[N]: prompt plus completion tokens of each record."""

    batch: pa.RecordBatch
    record: np.ndarray
    lines: np.ndarray
    block: BlockLines
    first_line: int
    tokens: np.ndarray

    @property
    def records(self) -> int:
        return len(self.lines)

    def raw(self, record: int) -> bytes:
        """Record ``record``'s JSON text."""
        return self.block.raw(int(self.lines[record]))

    def line(self, record: int) -> int:
        """Record ``record``'s source line number."""
        return self.first_line + int(self.lines[record])

    def formats(self) -> Counter[str]:
        """Records by the format that read them."""
        firsts = np.flatnonzero(np.diff(self.record, prepend=-1))  # each record's first row
        return Counter(self.batch.column("source_format").take(pa.array(firsts, pa.int64())).to_pylist())

    def split(self, records: int) -> tuple[ColumnarRun, ColumnarRun]:
        """The first ``records`` records and the rest."""
        cut = int(np.searchsorted(self.record, records))
        head = ColumnarRun(
            self.batch.slice(0, cut),
            self.record[:cut],
            self.lines[:records],
            self.block,
            self.first_line,
            self.tokens[:records],
        )
        tail = ColumnarRun(
            self.batch.slice(cut),
            self.record[cut:] - records,
            self.lines[records:],
            self.block,
            self.first_line,
            self.tokens[records:],
        )
        return head, tail


def takes(fmt: Format, options: ParseOptions) -> bool:
    """Whether the columnar road reads records of a source read by ``fmt`` with ``options``: chat or text
    completions named by their format or detected per record, with no ``--group-field`` or ``--agent-field``
    (which read fields of the record the road does not)."""
    framed = type(fmt).frame is Format.frame
    per_record = isinstance(fmt, PerRecord | VllmChat | VllmCompletions)
    return framed and per_record and not options.group_field and not options.agent_field


def _runs(taken: np.ndarray) -> list[tuple[int, int, bool]]:
    """``(start, stop, taken)`` of the maximal stretches of lines all taken or all not."""
    if not len(taken):
        return []
    cuts = np.flatnonzero(taken[1:] != taken[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(taken)]
    return [(a, b, bool(taken[a])) for a, b in itertools.pairwise(bounds)]


def _block_items(
    fmt: Format, first_line: int, text: BlockLines, lines: np.ndarray, rows: ChatRows
) -> Iterator[RawRecord | ColumnarRun]:
    """A block's items in line order (``lines``: the block line indices of the records taken, ``rows``
    their rows): runs of taken records, and the format's framing of every other line."""
    taken = np.zeros(len(text.starts), dtype=bool)
    taken[lines] = True
    ordinal = np.cumsum(rows.accepted) - 1
    row_record = ordinal[rows.record]  # each row's record among the accepted ones
    tokens = np.bincount(
        row_record,
        weights=np.diff(rows.batch.column("prompt_token_ids").offsets.to_numpy())
        + np.diff(rows.batch.column("completion_token_ids").offsets.to_numpy()),
        minlength=len(lines),
    ).astype(np.int64)
    done = 0  # accepted records before this stretch
    for start, stop, is_taken in _runs(taken):
        if not is_taken:
            yield from fmt.frame((first_line + i, text.raw(i)) for i in range(start, stop))
            continue
        count = stop - start
        first_row, last_row = np.searchsorted(row_record, [done, done + count])
        yield ColumnarRun(
            rows.batch.slice(int(first_row), int(last_row - first_row)),
            row_record[first_row:last_row] - done,
            lines[done : done + count],
            text,
            first_line,
            tokens[done : done + count],
        )
        done += count


def _record_samples(fmt: Format, raw: bytes, options: ParseOptions) -> list[Sample] | None:
    """The samples of a marked record (token arrays left as placeholders) as the per-record road reads its
    own fields: decoded, read by the chat reader, the run's options applied, its scalars checked; None where
    any step would not keep every choice as it is (the per-record road reads it then)."""
    try:
        obj = decode_json(raw)
        reader = fmt.reader(obj)
        samples = reader.scalars(obj, options) if isinstance(reader, VllmChat | VllmCompletions) else None
        for sample in samples or ():  # apply_options only fills in, so checking after it checks the same
            if check_sample(apply_options(sample, options, obj)) is not sample:
                return None
    except Exception:  # whatever would quarantine it, the per-record road says
        return None
    return samples


def _kinds(fmt: Format) -> tuple[str, ...]:
    """The ``object`` types of the records ``fmt`` reads as the road does: a named format reads every record
    as its own kind (a record of the other kind is its reader's to refuse)."""
    if isinstance(fmt, VllmChat):
        return (CHAT_OBJECT,)
    if isinstance(fmt, VllmCompletions):
        return (TEXT_OBJECT,)
    return (CHAT_OBJECT, TEXT_OBJECT)


def _taken_items(
    fmt: Format, first_line: int, parsed: ParsedBlock, options: ParseOptions, uri: str, now_ms: int
) -> Generator[RawRecord | ColumnarRun, None, int]:
    """The items of a parsed block; returns how many records the road took."""

    def samples(row: int) -> list[Sample] | None:
        text = parsed.texts.get(row)
        return _record_samples(fmt, parsed.text.raw(int(parsed.lines[row])) if text is None else text, options)

    rows = chat_rows(parsed.table, first_line + parsed.lines, parsed.marked, samples, _kinds(fmt), options, uri, now_ms)
    lines = parsed.lines[rows.accepted]
    yield from _block_items(fmt, first_line, parsed.text, lines, rows)
    return len(lines)


def framed_items(
    fmt: Format, blocks: Iterable[tuple[int, bytes]], options: ParseOptions, uri: str, now_ms: int
) -> Iterator[RawRecord | ColumnarRun]:
    """The records of a source given as :meth:`prl.io.sources.LineReader.blocks` yields it, in order: runs the
    columnar road takes, and the format's framed records of all other lines (``fmt`` must be one that
    :func:`takes`). A block with a ``\\r`` or without a final newline is framed line by
    line. Arrow parses each block on a worker thread (outside the GIL) while the rows of the block before it
    are built, validated and written."""
    poor = 0  # blocks in a row of which the road took less than half the lines
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prl-columnar") as pool:
        ahead: tuple[int, Future[ParsedBlock]] | None = None
        for first_line, data in blocks:
            framed = poor >= POOR_BLOCKS or not data.endswith(b"\n") or b"\r" in data
            read = None if framed else (first_line, pool.submit(parse_block, data))
            if ahead is not None:
                taken = yield from _taken_items(fmt, ahead[0], ahead[1].result(), options, uri, now_ms)
                poor = poor + 1 if 2 * taken < len(ahead[1].result().text.starts) else 0
            ahead = read
            if framed:
                yield from fmt.frame(lines_of([(first_line, data)]))
        if ahead is not None:
            yield from _taken_items(fmt, ahead[0], ahead[1].result(), options, uri, now_ms)


__all__ = ["ColumnarRun", "framed_items", "takes"]
