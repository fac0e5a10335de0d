"""``prl maintain``: keep a store that cron appends to every minute as fast as a fresh one.

For every table of the store (and the sample index), in turn:

1. **compact**: small data files are rewritten into files of about ``target_mb`` (deltalake ``optimize.compact``,
   the sample index sorted by key with ``optimize.z_order``;
   its commit adds the new files with ``dataChange: false``, so readers of new data and prl's watermarks, which
   follow ``dataChange`` adds, see no new rows);
2. **checkpoint**: a Parquet checkpoint of the log, so opening a table reads one file instead of replaying every
   commit, and commit files past Delta's log retention (30 days) are cleaned up; a table created before prl set
   its table properties (:data:`prl.store.tables.TABLE_PROPERTIES`: a checkpoint every 10 commits) gets them
   first, in one metadata commit (a writer's commit made against the table before it is made again after it);
3. **vacuum**: data files that no version within ``retention_hours`` references are deleted: the files compaction
   replaced, and files a killed run wrote but never committed (``full`` vacuum: files the log never named, once
   older than the window). A reader pinned at any version inside the window finds every file it needs.

Safety beside the other steps: the run holds the store's ``maintain`` lock (one maintenance at a time). Writers
are not blocked: compaction is an ordinary Delta commit that retries against concurrent appends and fails
only if a concurrent commit removed a file it rewrote; a write in flight has written its files moments ago,
far inside the retention window (at least one hour), so vacuum never takes them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from deltalake import ColumnProperties, CommitProperties, DeltaTable, WriterProperties

from prl import bounds
from prl.bounds import MAX_RETENTION_HOURS, MAX_TARGET_MB, MIN_RETENTION_HOURS, MIN_TARGET_MB, check_int
from prl.errors import ExitCode, RetryableIOError, UsageError
from prl.schema import TABLES, float_leaves
from prl.store.index import INDEX_TABLES, ROW_GROUP_ROWS
from prl.store.locks import holding
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
    properties_set: bool = False
    """Whether this run set prl's table properties (a table created by an older prl)."""
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
    with holding(store.uri, "maintain", enabled=lock and not dry_run):
        for name in chosen:
            try:
                done = _maintain_table(store, name, retention_hours, target_mb, dry_run)
            except OSError as exc:
                raise RetryableIOError(f"maintaining {name} in {store.uri} failed: {describe_error(exc)}") from exc
            if done is not None:
                result.tables.append(done)
    result.seconds = time.perf_counter() - started
    return result


def _compact(table: DeltaTable, name: str, target_mb: int, props: CommitProperties) -> dict[str, Any]:
    """Small files into ``target_mb`` files; the sample index is rewritten sorted by key (``z_order`` on one
    column sorts), in row groups whose key ranges prune lookups."""
    target = target_mb * 1024 * 1024
    if name in INDEX_TABLES:
        writer = WriterProperties(compression="ZSTD", max_row_group_size=ROW_GROUP_ROWS)
        return table.optimize.z_order(["key"], target_size=target, writer_properties=writer, commit_properties=props)
    return table.optimize.compact(target_size=target, writer_properties=data_writer(name), commit_properties=props)


def _set_properties(table: DeltaTable, props: CommitProperties) -> bool:
    """Give ``table`` the properties of :data:`TABLE_PROPERTIES` it lacks (one commit); whether it needed any.
    A property the table holds already is kept, whatever its value: an interval someone chose stays."""
    have = table.metadata().configuration
    wanted = {key: value for key, value in TABLE_PROPERTIES.items() if key not in have}
    if not wanted:
        return False
    table.alter.set_table_properties(wanted, raise_if_not_exists=False, commit_properties=props)
    return True


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
        if _set_properties(table, props):  # alters the table object in place: no second open
            out.properties_set = True
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


__all__ = ["DEFAULT_RETENTION_HOURS", "MaintainResult", "TableMaintenance", "maintain"]
