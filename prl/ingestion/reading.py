"""Reading trace source files into validated, deduplicated ``traces`` batches: the per-file half of ``prl ingest``.

:func:`read_file` streams one source (from its start, or on from where an earlier run stopped) through its format's
reader, validates and assembles its samples in batches (memory bounded by ``batch_tokens``), and yields the rows
not yet in the store; what it quarantines, the inline rewards of the rows it keeps and the file's ledger entry go
into a :class:`ReadState`. The same function runs on every engine: on the local engine's driver for each file of a
commit group in turn, on a Ray worker for a run of consecutive files (:mod:`prl.ingestion.remote`). Chat and
text completions of the common shape are read a block at a time by the columnar road (:mod:`prl.ingestion.columnar`),
every other record by its format's reader; both give the same rows and quarantine rows in the same order.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from prl.errors import FormatDetectionError
from prl.formats import registry
from prl.formats.base import Format, ParseOptions, Quarantined
from prl.formats.guard import as_quarantined, source_key, source_position
from prl.ingestion.assemble import Located, sample_id_of
from prl.ingestion.batch import Checked, check_and_assemble
from prl.ingestion.collect import RAW_KEEP, Collector
from prl.ingestion.columnar import ColumnarRun, framed_items, takes
from prl.ingestion.inline_rewards import inline_reward_rows
from prl.ingestion.ledger import ledger_entry
from prl.ingestion.result import FileReport
from prl.ingestion.resume import ResumePoint, continuation, fresh_reader, point_after
from prl.io.sources import LineReader, SourceFile, first_lines, lines_of
from prl.progress import Task
from prl.quarantine import quarantine_row
from prl.runtime import collect_young
from prl.schema import TRACES
from prl.store.index import SampleIndex

HEAD_LINES = 64
COLLECT_EVERY = 65536
COLLECT_QUARANTINED = 64
"""Records read, or records quarantined, between two collections of young objects
(:func:`prl.runtime.young_collections`): a quarantined record's caught exception holds its frames (and so
the decoded record) in a cycle until then."""


class Deduper:
    """Knows which sample IDs exist (with their digests): in the traces table, from the sample index; kept by the
    reads before this one that the same commit adds (``earlier``); and kept earlier in this read (``seen``,
    sample_id → record_digest: exactly the rows this read adds)."""

    def __init__(self, index: SampleIndex, earlier: Mapping[str, str] | None = None) -> None:
        self.index = index
        self.earlier: Mapping[str, str] = {} if earlier is None else earlier
        self.seen: dict[str, str] = {}

    def existing(self, sample_ids: list[str]) -> dict[str, str]:
        found = self.index.lookup(sample_ids)
        for sid in sample_ids:
            digest = self.seen.get(sid) or self.earlier.get(sid)
            if digest is not None:
                found[sid] = digest
        return found


@dataclass
class ReadState:
    """What reading some files produced besides their kept rows, in file order: quarantine rows, ledger
    entries, and the inline reward rows of the kept samples."""

    quarantine_rows: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    reward_rows: list[dict[str, Any]] = field(default_factory=list)
    partial_line_grace: float = 0.0
    """Seconds since its last change during which a plain file ending mid-line is left to grow."""
    points: dict[str, ResumePoint] = field(default_factory=dict)
    """Where earlier runs stopped in plain files that may have grown since, by URI."""


@dataclass
class _Opened:
    """A source opened for reading: from its start, or on from where an earlier run stopped."""

    reader: LineReader
    fmt: Format
    blocks: Iterator[tuple[int, bytes]]
    first_record: str | None = None
    """The :func:`source_key` of the file's first record read without error, once known."""


class _EmptySource(Exception):
    """A source with no record at all (empty, or blank lines only): nothing to detect, nothing lost."""


def _framed(reader: LineReader, fmt_name: str, uri: str) -> tuple[Format, Iterator[tuple[int, bytes]]]:
    """The source's format (detected from its first :data:`HEAD_LINES` lines unless named) and its blocks."""
    blocks = reader.blocks()
    read: list[tuple[int, bytes]] = []  # the blocks holding the head, framed again with the rest
    head: list[tuple[int, bytes]] = []
    for block in blocks:
        read.append(block)
        head.extend(lines_of([first_lines(block, HEAD_LINES - len(head))]))
        if len(head) >= HEAD_LINES:
            break
    if len(head) < HEAD_LINES and not any(line.strip() for _, line in head) and not reader.truncated:
        raise _EmptySource(uri)
    fmt = registry.per_record(registry.detect_file(uri, head)) if fmt_name == "auto" else registry.by_name(fmt_name)
    return fmt, itertools.chain(read, blocks)


def read_file(
    src: SourceFile,
    format: str,
    options: ParseOptions,
    report: FileReport,
    state: ReadState,
    dedup: Deduper,
    now_ms: int,
    batch_tokens: int,
    progress: Task | None,
) -> Iterator[pa.RecordBatch]:
    """The new ``traces`` rows of one source, batch by batch (about ``batch_tokens`` tokens each); what it
    quarantines and its ledger entry go into ``state``, its counts into ``report``; ``progress`` advances by
    the source bytes read, a MiB or more at a time."""
    opened = _open_source(src, format, report, state, now_ms)
    if opened is None:
        return
    reader, fmt, first_record = opened.reader, opened.fmt, opened.first_record
    columnar = takes(fmt, options)
    records = (
        framed_items(fmt, opened.blocks, options, src.uri, now_ms) if columnar else fmt.frame_blocks(opened.blocks)
    )
    counts: Counter[str] = Counter()
    report.format = fmt.name
    formats: Counter[str] = Counter()
    last_progress = 0
    held_tail = held_line = 0  # a record still open where the file ends, left for a later run: bytes, line
    cut_open = False  # a record open where the file ends was quarantined: no later run may start inside it
    garbage = 0  # records quarantined since the last collection

    def quarantine(
        line: int, raw: bytes, q: Quarantined, sample_id: str | None = None, name: str = fmt.name, table: str = "traces"
    ) -> None:
        nonlocal garbage
        counts[q.reason] += 1
        garbage += 1
        state.quarantine_rows.append(quarantine_row(src.uri, line, name, raw, q, now_ms, sample_id, table))

    collector = Collector(fmt, options, src.uri, quarantine)

    def flush() -> Iterator[pa.RecordBatch]:
        parts = collector.take_parts()
        if parts:
            yield from _dedup_and_assemble(parts, dedup, report, quarantine, now_ms, state.reward_rows)

    for record in records:
        if isinstance(record, ColumnarRun):
            first_record = source_key(record.raw(0)) if first_record is None else first_record
            report.records += record.records
            formats.update(record.formats())
            for _ in collector.add_run(record, batch_tokens):  # each time the batch is full
                yield from flush()
            if progress is not None and reader.bytes_read - last_progress >= 1 << 20:
                progress.advance(reader.bytes_read - last_progress)
                last_progress = reader.bytes_read
            continue
        if garbage >= COLLECT_QUARANTINED or report.records % COLLECT_EVERY == 0:
            collect_young()
            garbage = 0
        if record.unfinished is not None and reader.hold_partial and reader.compression == "none":
            held_tail, held_line = record.unfinished, record.line  # an SSE stream still being written
            continue
        cut_open = cut_open or record.unfinished is not None
        report.records += 1
        if record.error is not None:
            if reader.unterminated_line == record.line:
                record.error = Quarantined("truncated_line", "the file's last line is incomplete")
            quarantine(record.line, record.raw, record.error)
            continue
        first_record = source_key(record.raw) if first_record is None else first_record
        position = source_position(first_record, record.line)  # identity of records without a request id
        formats[collector.add(record, position)] += 1  # never raises: poison is quarantined
        if collector.tokens >= batch_tokens:
            yield from flush()
        if progress is not None and reader.bytes_read - last_progress >= 1 << 20:
            progress.advance(reader.bytes_read - last_progress)
            last_progress = reader.bytes_read
    yield from flush()
    if progress is not None:
        progress.advance(reader.bytes_read - last_progress)
    report.quarantined = dict(counts)
    report.formats = dict(formats)
    if len(formats) == 1:
        report.format = next(iter(formats))
    elif len(formats) > 1:
        report.format = "mixed"
    if reader.truncated:
        _record_truncation(src, reader, report, state, now_ms, fmt.name)
    resume = None if cut_open else point_after(reader, fmt.name, format, first_record, held_tail, held_line)
    state.ledger.append(ledger_entry(src, reader, report.format, report, held_tail, resume))


def _open_source(src: SourceFile, format: str, report: FileReport, state: ReadState, now_ms: int) -> _Opened | None:
    """The source's reader, format and records: on from where an earlier run stopped when the file still begins
    with the bytes it consumed, else from the start (the format detected unless named). None for a source
    with nothing to read (its ledger entry made) or whose format is unknown (``failed``)."""
    hold = src.changed_within(state.partial_line_grace)
    point = state.points.get(src.uri)
    resumed = None if point is None else continuation(src, point, format)
    if resumed is not None:
        reader = resumed.reader(src, hold)
        return _Opened(reader, resumed.fmt, reader.blocks(), resumed.point.first_record)
    reader = fresh_reader(src, hold)
    try:
        fmt, blocks = _framed(reader, format, src.uri)
    except _EmptySource:  # consumed with no records; if it grows, its identity changes and it is read again
        report.status = "empty"
        state.ledger.append(ledger_entry(src, reader, None, report))
        return None
    except FormatDetectionError as exc:
        if reader.truncated:  # nothing decodable before the damage: record the damage, not a format error
            _record_truncation(src, reader, report, state, now_ms, None)
            state.ledger.append(ledger_entry(src, reader, None, report))
            return None
        report.status, report.error, report.bytes_read = "failed", str(exc), reader.bytes_read
        return None
    return _Opened(reader, fmt, blocks)


def _record_truncation(
    src: SourceFile, reader: LineReader, report: FileReport, state: ReadState, now_ms: int, fmt: str | None
) -> None:
    """A compressed stream that ends early or is corrupt: one quarantine row saying so, after the last line."""
    assert reader.truncated is not None
    q = Quarantined("truncated_input", reader.truncated)
    state.quarantine_rows.append(quarantine_row(src.uri, report.records + 1, fmt, b"", q, now_ms))
    report.quarantined["truncated_input"] = report.quarantined.get("truncated_input", 0) + 1


Part = tuple[list[Located], list[bytes]] | ColumnarRun
"""One part of a batch (:meth:`Collector.take_parts`): rows of the per-record road with their raw text, or a
columnar run."""


@dataclass
class _Assembled:
    """A part's validated rows: ``batch``; for rows of the per-record road, ``rows`` / ``raws`` / ``at``
    (the input index of each batch row); for a columnar run, ``run``."""

    batch: pa.RecordBatch
    rows: list[Located] = field(default_factory=list)
    raws: list[bytes] = field(default_factory=list)
    at: np.ndarray | None = None
    run: ColumnarRun | None = None

    def source(self, j: int) -> tuple[int, bytes, int, str]:
        """Batch row ``j``'s source line, raw text (up to :data:`RAW_KEEP` bytes), choice index and format."""
        if self.run is not None:
            record = int(self.run.record[j])
            index, name = self.batch.column("choice_index")[j].as_py(), self.batch.column("source_format")[j].as_py()
            return self.run.line(record), self.run.raw(record)[:RAW_KEEP], index, name
        assert self.at is not None
        row = self.rows[int(self.at[j])]
        return row.source_line, self.raws[int(self.at[j])], row.sample.choice_index, row.source_format


def _validated(parts: list[Part], quarantine: Callable[..., None], now_ms: int) -> list[_Assembled]:
    """Each part's rows validated and assembled; the rows validation rejects are quarantined, in order."""
    out: list[_Assembled] = []
    for part in parts:
        if isinstance(part, ColumnarRun):
            out.append(_Assembled(part.batch, run=part))
            continue
        rows, raws = part
        checked = _checked(rows, now_ms)
        for i, q in checked.rejected:
            q.choice_index = rows[i].sample.choice_index
            quarantine(rows[i].source_line, raws[i], q, sample_id_of(rows[i].sample), name=rows[i].source_format)
        out.append(_Assembled(checked.batch, rows, raws, checked.rows))
    return out


def _dedup_and_assemble(
    parts: list[Part],
    dedup: Deduper,
    report: FileReport,
    quarantine: Callable[..., None],
    now_ms: int,
    reward_rows: list[dict[str, Any]],
) -> list[pa.RecordBatch]:
    """Validate and assemble one batch (columnar), quarantine its bad rows, and keep the rows not yet in the
    store: a known sample ID with the same digest is counted as already present, with another digest it is
    quarantined as ``duplicate_sample_id``. Returns the kept rows, a batch per part that keeps any."""
    assembled = _validated(parts, quarantine, now_ms)
    ids: list[str] = []
    digests: list[str] = []
    for part in assembled:
        ids += part.batch.column("sample_id").to_pylist()
        digests += part.batch.column("record_digest").to_pylist()
    starts = np.cumsum([0, *(part.batch.num_rows for part in assembled)])
    known = dedup.existing(ids)
    keep = np.zeros(len(ids), dtype=bool)
    for j, (sid, digest) in enumerate(zip(ids, digests, strict=True)):
        previous = known.get(sid)
        if previous is None:
            keep[j] = True
            known[sid] = digest
            dedup.seen[sid] = digest
        elif previous == digest:
            report.already_present += 1
        else:
            p = int(np.searchsorted(starts, j, side="right")) - 1
            line, raw, index, name = assembled[p].source(j - int(starts[p]))
            message = f"sample {sid} already exists with different tokens or logprobs"
            quarantine(line, raw, Quarantined("duplicate_sample_id", message, index), sid, name=name)
    kept_batches: list[pa.RecordBatch] = []
    for p, part in enumerate(assembled):
        kept_here = keep[starts[p] : starts[p + 1]]
        if not kept_here.any():
            continue
        if part.at is not None:
            _rewards(part, kept_here, ids[starts[p] : starts[p + 1]], quarantine, now_ms, reward_rows)
        kept = part.batch if kept_here.all() else part.batch.filter(pa.array(kept_here))
        report.samples += kept.num_rows
        report.prompt_tokens += _values(kept.column("prompt_token_ids"))
        report.completion_tokens += _values(kept.column("completion_token_ids"))
        kept_batches.append(kept)
    return kept_batches


def _values(lists: pa.ListArray) -> int:
    """Values in the rows of a list array (a slice's rows only)."""
    offsets = lists.offsets
    return int(offsets[-1].as_py() - offsets[0].as_py()) if len(lists) else 0


def _rewards(
    part: _Assembled,
    keep: np.ndarray,
    ids: list[str],
    quarantine: Callable[..., None],
    now_ms: int,
    reward_rows: list[dict[str, Any]],
) -> None:
    """The inline reward rows of a part's kept samples (an unreadable reward is quarantined in ``rewards``)."""
    assert part.at is not None
    kept_at = np.flatnonzero(keep)
    for j, i in zip(kept_at.tolist(), part.at[kept_at].tolist(), strict=True):
        row = part.rows[i]
        if not row.sample.rewards:
            continue  # no reward inline (inline_reward_rows gives none)
        try:
            reward_rows.extend(inline_reward_rows(row.sample, ids[j], row.source_uri, row.source_line, now_ms))
        except Quarantined as q:  # the sample lands; its unreadable reward is quarantined in the rewards table
            quarantine(row.source_line, part.raws[i], q, ids[j], table="rewards")


def _checked(rows: list[Located], now_ms: int) -> Checked:
    """:func:`check_and_assemble` of the batch; should a sample the readers produced break the batch (arrays
    no check expected), each sample is tried alone and the ones that fail are quarantined with the error, so
    one poison sample never costs its batch."""
    try:
        return check_and_assemble(rows, now_ms)
    except Exception:
        rejected: list[tuple[int, Quarantined]] = []
        fine: list[int] = []
        for i, row in enumerate(rows):
            try:
                alone = check_and_assemble([row], now_ms)
            except Exception as exc:
                rejected.append((i, as_quarantined(exc)))
                continue
            if alone.rejected:
                rejected.append((i, alone.rejected[0][1]))
            else:
                fine.append(i)
        if not fine:
            return Checked(pa.RecordBatch.from_pylist([], schema=TRACES), np.array([], np.int64), rejected)
        good = check_and_assemble([rows[i] for i in fine], now_ms)
        rejected += [(fine[j], q) for j, q in good.rejected]
        return Checked(good.batch, np.array(fine, dtype=np.int64)[good.rows], rejected)


__all__ = ["HEAD_LINES", "RAW_KEEP", "Deduper", "ReadState", "read_file"]
