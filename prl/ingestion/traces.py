"""``prl ingest``: sources → formats → validation → the ``traces`` and ``quarantine`` tables.

Per group of source files, one pass streams records in batches (memory bounded by ``batch_tokens``), then two
commits make the result visible: quarantine first, then traces with the source ledger (commit metadata listing
uri, size, mtime, sha256 of every file consumed) and one Delta ``txn`` per file identity. A file whose identity
(uri, size, mtime) is already in the ledger is skipped without being read; a plain file that grew since is read
on from where the last run stopped (:mod:`prl.ingestion.resume`). Killing a run at any instant and
running it again loses nothing and duplicates nothing:

- killed before the quarantine commit: nothing is visible, the rerun does it all again;
- killed between the two commits: the rerun re-reads the files; quarantine rows carry a content-derived
  ``quarantine_id`` and are not added twice; the traces commit happens;
- a sample already in ``traces`` with the same ``record_digest`` is skipped (counted as ``already_present``),
  one with a different digest is quarantined as ``duplicate_sample_id``.

``engine="ray"`` reads a group's files on a Ray cluster, in runs of consecutive files
(:mod:`prl.ingestion.remote`): each worker writes its files' rows as data files, and this process folds the
reads together in file order and makes the same commits, with the same ledger and transactions, as the local
engine; the tables hold the same rows.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from prl.engines import Engine
from prl.errors import UsageError
from prl.formats import registry
from prl.formats.base import ParseOptions, Sample
from prl.ingestion.inline_rewards import reward_batches
from prl.ingestion.reading import RAW_KEEP
from prl.ingestion.remote import IngestJob, UnitRead, merged, read_units, serving
from prl.ingestion.result import DEFAULT_MAX_QUARANTINE_RATE, FileReport, IngestResult
from prl.ingestion.resume import app_id, earlier_points
from prl.io import sources as io_sources
from prl.io.sources import SourceFile, scan
from prl.kernel import Work, execute
from prl.options import IngestOptions, checked
from prl.progress import Task, task
from prl.quarantine import new_quarantine_rows, quarantine_batches, quarantine_row
from prl.runtime import young_collections
from prl.schema import FINISH_REASONS
from prl.store.index import SampleIndex
from prl.store.resolve import open_store
from prl.store.tables import PendingCommit, Store
from prl.store.txns import transactions

BATCH_TOKENS = 2_000_000
"""Tokens (prompt + completion) per assembled batch: bounds memory to a few tens of MB per batch."""
GROUP_BYTES = 512 * 1024 * 1024
"""Source bytes per commit group: many small files share one commit."""
GROUP_FILES = 256


def ingest(
    sources: list[str],
    store: Store | str,
    *,
    format: str = IngestOptions.format,
    policy_version: str | None = None,
    group_field: str | None = None,
    finish_reason: str | None = None,
    agent_field: str | None = None,
    dry_run: bool = False,
    max_quarantine_rate: float | None = DEFAULT_MAX_QUARANTINE_RATE,
    batch_tokens: int = BATCH_TOKENS,
    progress: Callable[[int], None] | None = None,
    lock: bool = True,
    partial_line_grace: float | None = None,
    engine: Engine | str | None = None,
) -> IngestResult:
    """Ingest trace files into ``store``'s ``traces`` table (bad records into ``quarantine``).

    ``sources``: files, folders, globs or ``s3://`` prefixes. ``format``: ``auto`` (detected per file) or a
    format name from :mod:`prl.formats.registry`. ``policy_version`` fills in records that carry none;
    ``group_field`` names the record field that defines centering groups (default: a digest of the prompt IDs);
    ``finish_reason`` is used for records that carry none (RL rollout dumps often do not); ``agent_field`` names
    the record field that holds the agent inside a multi-agent session (default: where systems put it, see
    :mod:`prl.formats.agents`).
    ``progress`` is called with the number of source bytes read since the last call (the files being read: a
    :func:`prl.progress.task` named ``ingest``, in bytes, with a ``files`` count).
    ``partial_line_grace`` (seconds; default ``PRL_PARTIAL_LINE_GRACE`` or 300): a plain file that ends mid-line
    and changed more recently than this is still being written; its last line is not consumed (the ledger
    records the bytes read and the file is read again by the next run). Older, the line is ``truncated_line``;
    should its writer finish it later, a later run reads the line again and its samples land: the sample wins
    (the quarantine record stays as history; ``prl inspect`` counts it once, as superseded).
    The same for an SSE stream still open where such a file ends (left whole; older, ``truncated_stream``).
    ``engine`` (:func:`prl.engines.get_engine`: ``"local"``, the default, or ``"ray"``) decides where the files
    are read; the lock, the ledger and the commits stay in this process, with the same rows on every engine.
    """
    if format != "auto":
        registry.by_name(format)  # fail fast on an unknown name
    store = open_store(store, create=True, writing=not dry_run)
    started = time.perf_counter()
    result = IngestResult(store=store.uri, dry_run=dry_run, max_quarantine_rate=max_quarantine_rate)
    found = scan(sources)
    files = found.files
    result.files.extend(FileReport(p.uri, status=p.status, error=p.reason) for p in found.problems)
    checked(IngestOptions, "max_quarantine_rate", max_quarantine_rate)
    if finish_reason is not None and finish_reason not in FINISH_REASONS:
        raise UsageError(f"--finish-reason must be one of {', '.join(FINISH_REASONS)}, not {finish_reason!r}")
    grace = io_sources.partial_line_grace() if partial_line_grace is None else partial_line_grace
    options = ParseOptions(
        policy_version=policy_version, group_field=group_field, finish_reason=finish_reason, agent_field=agent_field
    )
    step = IngestStep(result, files, format, options, batch_tokens, grace, dry_run, progress)
    return execute(step, store, engine, lock=lock, started=started)


@dataclass
class IngestStep:
    """``prl ingest`` as the kernel runs it (:mod:`prl.kernel`): one work per group of pending source files, its
    files read in units (``read_units``) and committed together (:func:`_commit_group`)."""

    result: IngestResult
    files: list[SourceFile]
    format: str
    options: ParseOptions
    batch_tokens: int
    grace: float
    dry_run: bool
    progress: Callable[[int], None] | None
    lock: str = "ingest"
    version: int | None = None
    """The traces table's version after the last group's commit."""
    index: SampleIndex | None = None
    meter: Task | None = None

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        """Skip the files the ledger holds; then each group of the rest, its sample index and clock set as it
        starts (after the group before it committed)."""
        with young_collections():
            txns = transactions(store, "traces", store.latest("traces"))  # one pass over the log for every file
            pending: list[SourceFile] = []
            for src in self.files:
                if txns.lookup(f"prl.source:{src.identity}") is not None:
                    self.result.files.append(FileReport(src.uri, status="unchanged", bytes=src.size))
                    continue
                pending.append(src)
            index = self.index = SampleIndex(store, write=not self.dry_run)
            points = earlier_points(store, txns, [src.uri for src in pending])
            self.version = txns.table_version
            total = sum(src.size for src in pending)
            with task("ingest", total, "bytes", on_advance=self.progress, files=len(pending)) as meter:
                self.meter = meter
                for group in _groups(pending):
                    index.refresh()
                    now_ms = int(time.time() * 1000)  # the group's clock: its quarantine and ingest times
                    if not self.dry_run:
                        store.ensure("traces")  # created here, not by each task
                    job = IngestJob(
                        store.uri,
                        group,
                        self.format,
                        self.options,
                        self.batch_tokens,
                        self.grace,
                        {src.uri: points[src.uri] for src in group if src.uri in points},
                        self.dry_run,
                        now_ms=now_ms,
                        index=index.view(),
                    )
                    yield Work(
                        functools.partial(read_units, job),
                        job.units(width(len(job.files))),
                        around=functools.partial(serving, job, index, meter),
                        state=job,
                    )
            self.result.versions = {name: store.version_seen(name) for name in ("traces", "quarantine")}

    def commit(self, store: Store, work: Work, outputs: Iterator[UnitRead]) -> None:
        assert self.index is not None
        read = merged(work.state, outputs, self.index, self.meter)
        self.version = _commit_group(store, self.index, read, self.dry_run, self.result, self.version)

    def finish(self, seconds: float) -> IngestResult:
        self.result.seconds = seconds
        return self.result


def _groups(files: list[SourceFile]) -> Iterator[list[SourceFile]]:
    group: list[SourceFile] = []
    size = 0
    for src in files:
        if group and (size + src.size > GROUP_BYTES or len(group) >= GROUP_FILES):
            yield group
            group, size = [], 0
        group.append(src)
        size += src.size
    if group:
        yield group


def _commit_group(
    store: Store, index: SampleIndex, read: UnitRead, dry_run: bool, result: IngestResult, version: int | None
) -> int | None:
    """Make a group's read visible: quarantine, then inline rewards, then the traces files with the ledger and
    the transactions, in one commit each; returns the traces table's version after it."""
    state = read.state
    if state.quarantine_rows:
        rows = new_quarantine_rows(store, state.quarantine_rows)
        store.commit("quarantine", quarantine_batches(rows), dry_run=dry_run)
    if state.reward_rows:  # rewards the records carry inline: visible no later than their samples
        store.commit("rewards", reward_batches(state.reward_rows), dry_run=dry_run)
    transactions = {  # a file still being written is not marked consumed: the next run reads it again
        f"prl.source:{SourceFile(r['uri'], r['size'], r['mtime_ns']).identity}": 1
        for r in state.ledger
        if r["complete"]
    }
    expected = 1 if version is None else version + 1  # a missing table is created (0), then committed to
    transactions.update({app_id(r["uri"]): expected for r in state.ledger if "resume" in r})
    pending = PendingCommit(store, "traces", dry_run, read.adds, read.rows, read.bytes)
    committed = pending.commit(metadata={"sources": state.ledger, "command": "ingest"}, transactions=transactions)
    if not dry_run:
        index.committed(committed.version, read.seen)

    for report in read.reports:
        result.files.append(report)
        result.records += report.records
        result.samples += report.samples
        result.already_present += report.already_present
        for reason, count in report.quarantined.items():
            result.quarantined[reason] = result.quarantined.get(reason, 0) + count
    result.bytes_read += sum(r.bytes_read for r in read.reports)
    result.prompt_tokens += sum(r.prompt_tokens for r in read.reports)
    result.completion_tokens += sum(r.completion_tokens for r in read.reports)
    return version if committed.version is None else committed.version


__all__ = [
    "RAW_KEEP",
    "FileReport",
    "IngestResult",
    "Sample",
    "ingest",
    "new_quarantine_rows",
    "quarantine_batches",
    "quarantine_row",
]
