"""Reading a commit group of an ingest run in units of consecutive files, as an engine's tasks.

The driver describes one commit group in an :class:`IngestJob` (the store, the group's files, the options, the
resume points, the run's clock and the state of its sample index) and cuts it into units, one per task
(:meth:`IngestJob.units`: the local engine makes one unit of the whole group). :func:`read_unit` reads files
``lo:hi`` of the group (:func:`prl.ingestion.reading.read_file` file after file, one
:class:`~prl.ingestion.reading.Deduper`), writes their new rows as ``traces`` data files (invisible until
committed) and returns a :class:`UnitRead`: the files written, the reports, ledger entries, quarantine and reward
rows, and the sample IDs kept. Nothing here commits. A task run in the driver's process reads with the driver's
own index and advances its progress as it goes (:func:`serving`); elsewhere a worker keeps an index of its own.

:func:`merged` folds the units into the group's one read, in file order. A unit read alone answers exactly what a
read of the whole group answers for those files unless one of the samples it kept was kept by an earlier unit
(the same sample in two files of the group): only then is that unit read again on the driver, after the units
before it, and the files its first read wrote are removed.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake.transaction import AddAction

from prl.formats.base import ParseOptions
from prl.ingestion.reading import Deduper, ReadState, read_file
from prl.ingestion.result import FileReport
from prl.ingestion.resume import ResumePoint
from prl.io.sources import SourceFile
from prl.progress import Task
from prl.store.index import IndexView, SampleIndex
from prl.store.tables import Store


@dataclass(frozen=True)
class IngestJob:
    """One commit group of an ingest run as its readers need it. ``files``: the group's pending sources, in
    order; ``points``: where earlier runs stopped in them (by URI); ``now_ms``: the group's clock (quarantine and
    ingest times); ``index``: the driver's sample index as the group began (for readers in other processes)."""

    store_uri: str
    files: list[SourceFile]
    format: str
    options: ParseOptions
    batch_tokens: int
    partial_line_grace: float
    points: dict[str, ResumePoint]
    dry_run: bool
    now_ms: int = 0
    index: IndexView = field(default_factory=lambda: IndexView(None, {}))
    run: str = field(default_factory=lambda: uuid.uuid4().hex)
    """The run's id: what a task run in the driver's process finds the driver's index by (:func:`serving`)."""

    def units(self, count: int) -> list[tuple[int, int]]:
        """At most ``count`` runs ``(lo, hi)`` of consecutive files covering the group, of about equal bytes: a run
        ends before the file whose middle lies past its share of the bytes."""
        n = len(self.files)
        count = max(1, min(count, n))
        sizes = [max(src.size, 1) for src in self.files]
        total = sum(sizes)
        cuts, before = [0], 0
        for i in range(1, n):
            before += sizes[i - 1]
            left = count - len(cuts)  # runs still to begin
            if left > 0 and ((2 * before + sizes[i]) * count >= 2 * total * len(cuts) or n - i <= left):
                cuts.append(i)
        return list(zip(cuts, [*cuts[1:], n], strict=True))


@dataclass
class UnitRead:
    """Files ``lo:hi`` of a group, read: their reports, what :class:`ReadState` collected, the ``traces`` data
    files written for them (``adds``, ``rows``, ``bytes``) and the samples kept (``seen``, sample_id →
    record_digest)."""

    lo: int
    hi: int
    reports: list[FileReport] = field(default_factory=list)
    state: ReadState = field(default_factory=ReadState)
    adds: list[AddAction] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    seen: dict[str, str] = field(default_factory=dict)
    reported: bool = False
    """Whether the read advanced the driver's progress as it went (a task run in the driver's process)."""

    def extend(self, other: UnitRead) -> None:
        """Append the read of the files after these."""
        self.hi = other.hi
        self.reports += other.reports
        self.state.quarantine_rows += other.state.quarantine_rows
        self.state.ledger += other.state.ledger
        self.state.reward_rows += other.state.reward_rows
        self.adds += other.adds
        self.rows += other.rows
        self.bytes += other.bytes
        self.seen.update(other.seen)


def read_unit(
    job: IngestJob,
    lo: int,
    hi: int,
    index: SampleIndex,
    earlier: dict[str, str] | None = None,
    progress: Task | None = None,
) -> UnitRead:
    """Read files ``lo:hi`` of ``job`` and write their new rows into ``index``'s store (nothing in a dry run);
    ``earlier``: the samples the units before these keep (None: these files come first)."""
    store = index.store
    state = ReadState(partial_line_grace=job.partial_line_grace, points=job.points)
    dedup = Deduper(index, earlier)
    read = UnitRead(lo, hi, state=state, seen=dedup.seen)

    def batches() -> Iterable[pa.RecordBatch]:
        for src in job.files[lo:hi]:
            report = FileReport(src.uri, bytes=src.size)
            read.reports.append(report)
            yield from read_file(
                src, job.format, job.options, report, state, dedup, job.now_ms, job.batch_tokens, progress
            )
            if progress is not None:
                progress.advance(files=1)

    pending = store.write_files("traces", batches(), dry_run=job.dry_run)
    read.adds, read.rows, read.bytes = pending.adds, pending.rows, pending.bytes
    return read


_INDEX: dict[str, SampleIndex] = {}
"""The sample index this worker process keeps open (store URI → index): a worker serves many units of a run,
and loads each index file once."""

_SERVED: dict[str, tuple[SampleIndex, Task | None]] = {}
"""The driver's own index and progress by run id, for the tasks that run in its process (:func:`serving`)."""


@contextlib.contextmanager
def serving(job: IngestJob, index: SampleIndex, progress: Task | None) -> Iterator[None]:
    """While the driver reads a group of ``job``'s run: a task of the run that runs in its process reads with the
    driver's ``index`` (as the job's view shows it: nothing to load) and advances ``progress`` as it reads."""
    _SERVED[job.run] = (index, progress)
    try:
        yield
    finally:
        _SERVED.pop(job.run, None)


def _index(job: IngestJob) -> SampleIndex:
    index = _INDEX.get(job.store_uri)
    if index is None:
        _INDEX.clear()
        index = _INDEX[job.store_uri] = SampleIndex(Store(job.store_uri), write=False)
    index.adopt(job.index)
    return index


def read_units(job: IngestJob, unit: tuple[int, int]) -> list[UnitRead]:
    """An engine's task: files ``lo:hi`` of ``job`` read with :func:`read_unit`, by the driver's index where it
    runs in the driver's process (:func:`serving`), else by this worker's."""
    lo, hi = unit
    served = _SERVED.get(job.run)
    if served is None:
        return [read_unit(job, lo, hi, _index(job))]
    index, progress = served
    read = read_unit(job, lo, hi, index, progress=progress)
    read.reported = progress is not None
    return [read]


def merged(
    job: IngestJob,
    reads: Iterable[UnitRead],
    index: SampleIndex,
    progress: Task | None = None,
) -> UnitRead:
    """The group's one read from its units' reads (any order; together they must cover the group once): a unit
    that kept a sample an earlier unit kept is read again here, after the units before it (see the module
    docstring). ``progress`` advances by each unit's bytes and files as it is folded in."""
    ordered = sorted(reads, key=lambda r: r.lo)
    spans = [(r.lo, r.hi) for r in ordered]
    expected = list(zip([0, *(hi for _, hi in spans[:-1])], [hi for _, hi in spans], strict=True))
    if spans != expected or (spans and spans[-1][1] != len(job.files)) or (not spans and job.files):
        raise RuntimeError(f"the units read {spans} do not cover the group's {len(job.files)} files once")
    out = UnitRead(0, 0)
    for read in ordered:
        if not out.seen.keys().isdisjoint(read.seen):
            _discard(index.store, read)
            reported = read.reported  # the same files: counted once, as the first read went
            read = read_unit(job, read.lo, read.hi, index, earlier=out.seen)
            read.reported = reported
        if progress is not None and not read.reported:
            progress.advance(sum(r.bytes_read for r in read.reports), files=len(read.reports))
        if len(ordered) == 1:
            return read
        out.extend(read)
    return out


def _discard(store: Store, read: UnitRead) -> None:
    """Remove the data files a unit's superseded read wrote (best effort: never committed, so never visible, and
    ``vacuum`` removes what is left)."""
    for add in read.adds:
        with contextlib.suppress(Exception):
            store.fs.delete_file(f"{store.table_path('traces')}/{add.path}")


__all__ = ["IngestJob", "UnitRead", "merged", "read_unit", "read_units", "serving"]
