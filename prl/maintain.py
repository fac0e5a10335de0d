"""``prl maintain``: keep a store that cron appends to every minute as fast as a fresh one.

For every table of the store (and the sample index), in turn:

1. **compact**: small data files are rewritten into files of about ``target_mb`` (deltalake ``optimize.compact``,
   the sample index sorted by key with ``optimize.z_order``;
   its commit adds the new files with ``dataChange: false``, so readers of new data and prl's watermarks, which
   follow ``dataChange`` adds, see no new rows);
2. **checkpoint**: a Parquet checkpoint of the log, so opening a table reads one file instead of replaying every
   commit, and commit files past Delta's log retention (30 days) are cleaned up;
3. **vacuum**: data files that no version within ``retention_hours`` references are deleted: the files compaction
   replaced, and files a killed run wrote but never committed (``full`` vacuum: files the log never named, once
   older than the window). A reader pinned at any version inside the window finds every file it needs.

``prl maintain --upgrade`` (:func:`upgrade`) instead brings a store of an older format
(:mod:`prl.store.format`) to this prl's, once: see its docstring.

Safety beside the other steps: the run holds the store's ``maintain`` lock (one maintenance at a time). Writers
are not blocked: compaction is an ordinary Delta commit that retries against concurrent appends and fails
only if a concurrent commit removed a file it rewrote; a write in flight has written its files moments ago,
far inside the retention window (at least one hour), so vacuum never takes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import ColumnProperties, CommitProperties, DeltaTable, Field, WriterProperties, write_deltalake

from prl import bounds
from prl.bounds import MAX_RETENTION_HOURS, MAX_TARGET_MB, MIN_RETENTION_HOURS, MIN_TARGET_MB, check_int
from prl.errors import ExitCode, RetryableIOError, UsageError
from prl.event_ids import Occurrences, ref_ids, reward_contents
from prl.kernel import Work, execute
from prl.schema import TABLES, TIMESTAMP_MS, float_leaves
from prl.store.format import STORE_FORMAT, outdated, store_format, write_marker
from prl.store.index import EVENT_INDEXES, INDEX_TABLES, ROW_GROUP_ROWS, SampleIndex
from prl.store.resolve import open_store
from prl.store.tables import TABLE_PROPERTIES, Store, describe_error
from prl.text import counted

DEFAULT_RETENTION_HOURS = bounds.RETENTION_HOURS
"""Delta's own default: a reader may stay pinned at a version for a week."""
DEFAULT_TARGET_MB = bounds.TARGET_MB
DATA_ROW_GROUP_ROWS = 4096
"""Rows per row group of a compacted data file: about one ingest batch of chat samples. Readers decode a row group
at a time, so this bounds their memory whatever the file's size (delta-rs's default, one row group per file of up
to a million rows, made a build-shards scan of a compacted 40 M-token store peak at 1.4 GB instead of 0.7 GB)."""
MAINTAINED = (*TABLES, *INDEX_TABLES)


@dataclass
class TableMaintenance:
    """What maintenance did to one table (``files_*``: data files in the snapshot before and after)."""

    table: str
    version_before: int
    version_after: int
    files_before: int
    files_after: int
    files_compacted: int = 0
    files_written: int = 0
    checkpointed: bool = False
    files_vacuumed: int = 0


@dataclass
class MaintainResult:
    """Summary of a ``prl maintain`` run; tables that do not exist yet are left out."""

    store: str
    retention_hours: int
    dry_run: bool = False
    tables: list[TableMaintenance] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(command="maintain", exit_code=int(self.exit_code))
        return out

    def headline(self) -> str:
        before = sum(t.files_before for t in self.tables)
        after = sum(t.files_after for t in self.tables)
        vacuumed = sum(t.files_vacuumed for t in self.tables)
        return f"{counted(len(self.tables), 'table')}: {before:,} → {after:,} files, {vacuumed:,} vacuumed"


def maintain(
    store: Store | str,
    *,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    target_mb: int = DEFAULT_TARGET_MB,
    tables: tuple[str, ...] | list[str] | None = None,
    dry_run: bool = False,
    lock: bool = True,
) -> MaintainResult:
    """Compact, checkpoint and vacuum the store's tables (all of them unless ``tables`` names some).

    ``retention_hours``: how long a replaced or never-committed file is kept for readers of older versions
    (see :mod:`prl.bounds` for its range and ``target_mb``'s). ``dry_run``: report the files vacuum would delete;
    compact and checkpoint nothing. Raises :class:`UsageError` for a bad retention, size or table name and for a
    path that is not a store (nothing is created there), :class:`RetryableIOError` for storage trouble.
    """
    check_int("--retention-hours", retention_hours, MIN_RETENTION_HOURS, MAX_RETENTION_HOURS)
    check_int("--target-mb", target_mb, MIN_TARGET_MB, MAX_TARGET_MB)
    chosen = tuple(tables) if tables else MAINTAINED
    unknown = [t for t in chosen if t not in MAINTAINED]
    if unknown:
        raise UsageError(f"unknown table {unknown[0]!r}: maintainable tables are {', '.join(MAINTAINED)}")
    store = open_store(store, writing=not dry_run)
    started = time.perf_counter()
    result = MaintainResult(store=store.uri, retention_hours=retention_hours, dry_run=dry_run)
    return execute(MaintainStep(result, chosen, target_mb, dry_run), store, lock=lock, started=started)


@dataclass
class MaintainStep:
    """``prl maintain`` as the kernel runs it (:mod:`prl.kernel`): one work per table, with no tasks; its commit
    compacts, checkpoints and vacuums the table."""

    result: MaintainResult
    tables: tuple[str, ...]
    target_mb: int
    dry_run: bool
    lock: str = "maintain"

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        for name in self.tables:
            yield Work(state=name)

    def commit(self, store: Store, work: Work, outputs: Iterator[Any]) -> None:
        name, result = work.state, self.result
        try:
            done = _maintain_table(store, name, result.retention_hours, self.target_mb, self.dry_run)
        except OSError as exc:
            raise RetryableIOError(f"maintaining {name} in {store.uri} failed: {describe_error(exc)}") from exc
        if done is not None:
            result.tables.append(done)

    def finish(self, seconds: float) -> MaintainResult:
        self.result.seconds = seconds
        return self.result


def _compact(table: DeltaTable, name: str, target_mb: int, props: CommitProperties) -> dict[str, Any]:
    """Small files into ``target_mb`` files; the sample index is rewritten sorted by key (``z_order`` on one
    column sorts), in row groups whose key ranges prune lookups."""
    target = target_mb * 1024 * 1024
    if name in INDEX_TABLES:
        writer = WriterProperties(compression="ZSTD", max_row_group_size=ROW_GROUP_ROWS)
        return table.optimize.z_order(["key"], target_size=target, writer_properties=writer, commit_properties=props)
    return table.optimize.compact(target_size=target, writer_properties=data_writer(name), commit_properties=props)


def data_writer(name: str) -> WriterProperties:
    """How compaction writes a data table's files: zstd, row groups of :data:`DATA_ROW_GROUP_ROWS` rows, and the
    top-level floating-point columns byte-stream-split without a dictionary as prl's own writer does (delta-rs
    applies column settings to top-level columns only, so list leaves keep its defaults)."""
    floats = [path for path in float_leaves(TABLES[name]) if "." not in path]
    split = ColumnProperties(dictionary_enabled=False, encoding="BYTE_STREAM_SPLIT")
    return WriterProperties(
        compression="ZSTD", max_row_group_size=DATA_ROW_GROUP_ROWS, column_properties=dict.fromkeys(floats, split)
    )


def _maintain_table(
    store: Store, name: str, retention_hours: int, target_mb: int, dry_run: bool
) -> TableMaintenance | None:
    table = store.open(name)
    if table is None:
        return None
    before = table.version()
    files_before = len(table.get_add_actions())
    out = TableMaintenance(name, before, before, files_before, files_before)
    props = CommitProperties(custom_metadata={"prl.operation": '"maintain"'}, max_commit_retries=50)
    if not dry_run:
        metrics = _compact(table, name, target_mb, props)
        out.files_compacted = int(metrics.get("numFilesRemoved", 0))
        out.files_written = int(metrics.get("numFilesAdded", 0))
        table = store.open(name) or table
        table.create_checkpoint()
        table.cleanup_metadata()
        out.checkpointed = True
    deleted = table.vacuum(
        retention_hours=retention_hours,
        dry_run=dry_run,
        enforce_retention_duration=False,
        full=True,
        commit_properties=props,
    )
    out.files_vacuumed = len(deleted)
    fresh = store.open(name) or table
    out.version_after = fresh.version()
    out.files_after = len(fresh.get_add_actions())
    return out


# --- upgrade -----------------------------------------------------------------------------------------------


@dataclass
class TableUpgrade:
    """What the upgrade did to one table (a dry run: what it would do)."""

    table: str
    columns_added: list[str] = field(default_factory=list)
    """Nullable columns added since the table was created (its older rows read them as null)."""
    properties_set: bool = False
    """Whether prl's table properties (:data:`TABLE_PROPERTIES`) were set (a table created before them)."""
    event_ids_filled: int = 0
    """Side-table rows stored without ``event_id`` that were given theirs (the table rewritten in one commit)."""
    index_rebuilt: bool = False
    """Whether the side table's event index was written again from its rows."""


@dataclass
class UpgradeResult:
    """Summary of a ``prl maintain --upgrade`` run: the store's format before and after, and what each table
    needed (none when the store was of this prl's format already)."""

    store: str
    format_before: int
    format_after: int
    dry_run: bool = False
    tables: list[TableUpgrade] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(command="maintain", upgrade=True, exit_code=int(self.exit_code))
        return out

    def headline(self) -> str:
        if self.format_before == STORE_FORMAT:
            return f"format {STORE_FORMAT} already: nothing to upgrade"
        columns = sum(len(t.columns_added) for t in self.tables)
        filled = sum(t.event_ids_filled for t in self.tables)
        done = "would go" if self.dry_run else "went"
        return (
            f"format {self.format_before} {done} to {STORE_FORMAT}: {counted(columns, 'column')} added, "
            f"{counted(filled, 'event id')} filled"
        )


def upgrade(store: Store | str, *, dry_run: bool = False, lock: bool = True) -> UpgradeResult:
    """Bring a store of an older format (:mod:`prl.store.format`) to :data:`STORE_FORMAT`; a store of this
    format is left as it is (running it twice is running it once).

    From format 1: each table gets the nullable columns added since it was created and prl's table properties,
    side-table rows stored without ``event_id`` get theirs (computed as an ingest of their source computes them:
    the file's n-th identical event in line order; one commit rewrites the table) and the side tables' event
    indexes are written again from the rows; the marker recording the new format is written last. Each step
    checks what is left to do, so a run killed anywhere is finished by the next one. The run holds the store's
    ``maintain`` lock; other commands refuse the store until the marker is written.

    ``dry_run``: report what would be done, change nothing. Raises :class:`UsageError` for a path that is not a
    store or a store of a newer format, :class:`RetryableIOError` for storage trouble."""
    store = open_store(store, writing=not dry_run, upgrading=True)
    started = time.perf_counter()
    result = UpgradeResult(store=store.uri, format_before=0, format_after=0, dry_run=dry_run)
    return execute(UpgradeStep(result, dry_run), store, lock=lock, started=started)


@dataclass
class UpgradeStep:
    """``prl maintain --upgrade`` as the kernel runs it (:mod:`prl.kernel`): the store's format read under the
    lock, then one work per table (none for a store of this format), with no tasks, and a last work whose commit
    writes the marker of the new format."""

    result: UpgradeResult
    dry_run: bool
    lock: str = "maintain"
    rebuilt: set[str] = field(default_factory=set)
    """Event indexes just written again from their table's rows (not upgraded again)."""

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        before = store_format(store) or STORE_FORMAT
        if before > STORE_FORMAT:
            raise outdated(store.uri, before)
        self.result.format_before = self.result.format_after = before
        if before == STORE_FORMAT:
            return
        for name in MAINTAINED:
            if name not in self.rebuilt:
                yield Work(state=name)
        if not self.dry_run:
            yield Work(state=None)

    def commit(self, store: Store, work: Work, outputs: Iterator[Any]) -> None:
        name, result = work.state, self.result
        if name is None:  # every table done: the marker goes last
            write_marker(store, STORE_FORMAT)
            result.format_after = STORE_FORMAT
            return
        props = CommitProperties(custom_metadata={"prl.operation": '"upgrade"'}, max_commit_retries=50)
        try:
            done = _upgrade_table(store, name, props, self.dry_run)
        except OSError as exc:
            raise RetryableIOError(f"upgrading {name} in {store.uri} failed: {describe_error(exc)}") from exc
        if done is not None:
            result.tables.append(done)
            if done.index_rebuilt:
                self.rebuilt.add(EVENT_INDEXES[name].index_table)

    def finish(self, seconds: float) -> UpgradeResult:
        self.result.seconds = seconds
        return self.result


def _upgrade_table(store: Store, name: str, props: CommitProperties, dry_run: bool) -> TableUpgrade | None:
    table = store.open(name)
    if table is None:
        return None
    out = TableUpgrade(name)
    if name in TABLES:
        have = {f.name for f in table.schema().fields}
        missing = [f for f in TABLES[name] if f.name not in have]
        if any(not f.nullable for f in missing):
            raise UsageError(
                f"table {name!r} in {store.uri} lacks required columns {[f.name for f in missing]}: not a prl table"
            )
        out.columns_added = [f.name for f in missing]
        if missing and not dry_run:
            table.alter.add_columns([Field.from_arrow(f) for f in missing], commit_properties=props)
            table = store.open(name) or table
    out.properties_set = _set_properties(table, props, dry_run)
    if name in EVENT_INDEXES:
        out.event_ids_filled = _fill_event_ids(store, name, props, dry_run)
        if not dry_run:
            SampleIndex(store, spec=EVENT_INDEXES[name]).refresh(rebuild=True)
        out.index_rebuilt = not dry_run
    return out


def _fill_event_ids(store: Store, name: str, props: CommitProperties, dry_run: bool) -> int:
    """Give the rows of side table ``name`` stored without ``event_id`` theirs, in one commit that rewrites the
    table (streamed: a batch at a time, plus the keys of those rows for rewards); how many rows had none."""
    table = store.open(name)
    assert table is not None
    version = table.version()
    dataset = store.dataset(name, version)
    assert dataset is not None
    if "event_id" not in dataset.schema.names:  # a dry run: the column is not there yet
        return dataset.count_rows()
    # Counted and picked out of whole scans: a filter on the column may be answered from the files' statistics,
    # and files written before the column existed have none for it.
    count = sum(batch.column(0).null_count for batch in store.scan(name, columns=["event_id"], version=version))
    if count == 0 or dry_run:
        return count
    ids = None
    if name == "rewards":
        columns = [*_REWARD_KEY, "ingested_at", "event_id"]
        lacking = [b.filter(b.column("event_id").is_null()) for b in store.scan(name, columns, version=version)]
        ids = _reward_ids_by_key(pa.Table.from_batches(lacking, pa.schema([dataset.schema.field(c) for c in columns])))

    def batches() -> Iterator[pa.RecordBatch]:  # read from the dataset opened here: the writer calls it
        for batch in dataset.to_batches(batch_size=4096, fragment_scan_options=store.scan_options):
            yield _with_ids(batch, ids)

    reader = pa.RecordBatchReader.from_batches(dataset.schema, batches())
    write_deltalake(table, reader, mode="overwrite", writer_properties=data_writer(name), commit_properties=props)
    return count


_REWARD_KEY = ("source_uri", "source_line", "sample_id", "name", "value", "created_at")
"""What tells reward rows apart (rows equal in all of it are one event's occurrences, interchangeable)."""


def _reward_key_rows(rows: pa.Table | pa.RecordBatch) -> list[tuple[Any, ...]]:
    columns = [rows.column(c).to_pylist() for c in _REWARD_KEY[:-1]]
    columns.append(rows.column("created_at").cast(TIMESTAMP_MS).cast(pa.int64()).to_pylist())
    return list(zip(*columns, strict=True))


def _reward_ids_by_key(rows: pa.Table) -> dict[tuple[Any, ...], list[str]]:
    """Event ids of reward rows stored without one, by :data:`_REWARD_KEY`: per source file, in line order,
    each the n-th identical event of its file (a row whose ``created_at`` is its ``ingested_at`` had no time of
    its own: the ingest time filled it in)."""
    rows = rows.set_column(
        rows.schema.get_field_index("created_at"), "created_at", rows["created_at"].cast(TIMESTAMP_MS)
    )
    rows = rows.sort_by([("source_uri", "ascending"), ("source_line", "ascending")])
    out: dict[tuple[Any, ...], list[str]] = {}
    for uri in pc.unique(rows["source_uri"]).to_pylist():
        batch = rows.filter(pc.equal(rows["source_uri"], uri)).combine_chunks().to_batches()[0]
        created = batch.column("created_at").cast(pa.int64()).to_numpy()
        ingested = batch.column("ingested_at").cast(TIMESTAMP_MS).cast(pa.int64()).to_numpy()
        ids = Occurrences().ids(reward_contents(batch, created != ingested))
        for key, event_id in zip(_reward_key_rows(batch), ids, strict=True):
            out.setdefault(key, []).append(event_id)
    return out


def _with_ids(batch: pa.RecordBatch, rewards: dict[tuple[Any, ...], list[str]] | None) -> pa.RecordBatch:
    """``batch`` with the rows without ``event_id`` given theirs (rewards: from ``rewards``, by key; reference
    rows: computed from their content)."""
    at = batch.schema.get_field_index("event_id")
    column = batch.column(at)
    if column.null_count == 0:
        return batch
    rows = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))
    lacking = batch.take(pa.array(rows, pa.int64()))
    if rewards is not None:
        filled = [rewards[key].pop() for key in _reward_key_rows(lacking)]
    else:
        lists = lacking.column("ref_logprobs")
        filled = ref_ids(lacking.column("sample_id").to_pylist(), lacking.column("ref_model").to_pylist(), lists)
        filled = filled.to_pylist()
    values = column.to_pylist()
    for row, event_id in zip(rows.tolist(), filled, strict=True):
        values[row] = event_id
    return batch.set_column(at, batch.schema.field(at), pa.array(values, pa.string()))


def _set_properties(table: DeltaTable, props: CommitProperties, dry_run: bool) -> bool:
    """Give ``table`` the properties of :data:`TABLE_PROPERTIES` it lacks (one commit); whether it needed any.
    A property the table holds already is kept, whatever its value: an interval someone chose stays."""
    have = table.metadata().configuration
    wanted = {key: value for key, value in TABLE_PROPERTIES.items() if key not in have}
    if not wanted:
        return False
    if not dry_run:
        table.alter.set_table_properties(wanted, raise_if_not_exists=False, commit_properties=props)
    return True


__all__ = [
    "DEFAULT_RETENTION_HOURS",
    "MaintainResult",
    "TableMaintenance",
    "TableUpgrade",
    "UpgradeResult",
    "maintain",
    "upgrade",
]
