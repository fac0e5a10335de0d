"""Writing a store table: data files first, then one atomic Delta commit that survives a lost answer.

:func:`write_files` streams record batches into new Parquet files of a table (invisible to readers) on one
writer thread; any failure of a write or a close ends it at once and surfaces in the caller as
:class:`~prl.errors.RetryableIOError` (exit 5) for storage errors, the files it began removed where possible.
:meth:`PendingCommit.commit` adds them in one Delta commit, after checking that the locks this process holds
on the store are still its own (:func:`prl.store.holder.ensure_held`). Every commit carries a unique
``prl.commit_id``: when a commit call fails (a connection dropped before S3's answer, delta-rs meeting its own
commit on a retry), the Delta log is searched for it, and a commit found there is this run's and counts as done.
A commit refused because another writer changed the table's metadata meanwhile (``prl maintain`` setting a table
property) is made once more against the table brought up to date; any other failure is retryable (exit 5), a
rerun resumes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, Transaction
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, RemoveAction

from prl.errors import RetryableIOError
from prl.schema import TABLES, float_leaves, leaf_paths
from prl.store import holder

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from prl.store.tables import Store

log = logging.getLogger(__name__)

METADATA_CHANGED = "Metadata changed since last commit"
"""What delta-rs says when a commit meets a metadata commit made since the version it was made against."""

TARGET_FILE_BYTES = 128 * 1024 * 1024
"""Uncompressed Arrow bytes after which a data file is closed and a new one begun."""
IN_FLIGHT_BATCHES = 2
"""Batches handed to the writer thread and not yet written: the producer runs this far ahead, no further."""


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """Writer settings of a table's data files: zstd; floating-point columns (logprobs) byte-stream-split and
    without a dictionary (a dictionary of sampled logprobs only grows until Parquet gives up on it; split bytes
    compress and decode faster); every other column with a dictionary where it pays (Parquet's default)."""
    floats = float_leaves(schema)
    return {
        "compression": "zstd",
        "use_dictionary": [path for path, _ in leaf_paths(schema) if path not in floats],
        "use_byte_stream_split": floats,
    }


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe_error(exc: BaseException) -> str:
    """One plain line for a storage error: delta-rs prints its chain of causes on coloured lines."""
    parts = (line.strip().lstrip("↳").strip() for line in _ANSI.sub("", str(exc)).splitlines())
    return " ← ".join(part for part in parts if part)


@dataclass
class CommitResult:
    """What one :meth:`PendingCommit.commit` did. ``version`` is None when there was nothing to commit."""

    table: str
    version: int | None
    rows: int
    files: int
    bytes: int


@dataclass
class PendingCommit:
    """Data files written for one table and not yet committed."""

    store: Store
    table: str
    dry_run: bool = False
    adds: list[AddAction] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0

    def commit(
        self, metadata: Mapping[str, Any] | None = None, transactions: Mapping[str, int] | None = None
    ) -> CommitResult:
        """Make the files visible in one Delta commit carrying ``metadata`` (JSON-encoded under ``prl.*``
        keys of the commit info) and ``transactions`` (Delta txn actions, app id → version). With no files and
        no transactions, nothing is committed. Raises :class:`~prl.errors.LockLostError` when a lock this
        process holds on the store was taken over, :class:`~prl.errors.RetryableIOError` when the commit
        failed and is not in the log."""
        if self.dry_run or (not self.adds and not transactions):
            return CommitResult(self.table, None, self.rows, len(self.adds), self.bytes)
        custom = {f"prl.{key}": json.dumps(value, sort_keys=True) for key, value in (metadata or {}).items()}
        commit_id = uuid.uuid4().hex  # finds this commit's version, also when its answer was lost
        custom["prl.commit_id"] = json.dumps(commit_id)
        props = CommitProperties(
            custom_metadata=custom,
            app_transactions=[Transaction(app_id, version) for app_id, version in (transactions or {}).items()],
            max_commit_retries=50,
        )
        table = self.store.ensure(self.table)
        read_version = table.version()
        holder.ensure_held(self.store.location)
        actions: list[AddAction | RemoveAction] = [*self.adds]
        version: int | None
        try:
            try:
                table.create_write_transaction(actions, "append", TABLES[self.table], commit_properties=props)
            except DeltaError as exc:
                if not self._metadata_changed_since(table, exc):
                    raise
                # brought up to date; a commit whose answer was lost may have landed before the metadata commit
                # that refused the next try (delta-rs then tried it again at a later version): not twice
                landed = self.store.committed_version(
                    self.table, commit_id, window=table.version() - read_version, exact=True, latest=table.version()
                )
                if landed is not None:
                    return CommitResult(self.table, landed, self.rows, len(self.adds), self.bytes)
                read_version = table.version()  # the commit is made against it once more
                table.create_write_transaction(actions, "append", TABLES[self.table], commit_properties=props)
        except (OSError, DeltaError) as exc:
            version = self._own_commit_after(exc, commit_id)
        else:
            try:
                table.update_incremental()  # reads only the log entries after the version it was opened at
                latest = table.version()
                # this commit is newer than the version it was made against: when the log holds just one newer
                # version, that is this commit; else the log says which one is
                one_newer = latest == read_version + 1
                version = latest if one_newer else self.store.committed_version(self.table, commit_id, latest=latest)
            except OSError as exc:  # committed; a rerun finds it (ledger, txn) and adds nothing
                raise RetryableIOError(
                    f"committed to {self.table} in {self.store.uri}, then reading its version failed: "
                    f"{describe_error(exc)}"
                ) from exc
        return CommitResult(self.table, version, self.rows, len(self.adds), self.bytes)

    def _metadata_changed_since(self, table: DeltaTable, exc: DeltaError) -> bool:
        """Whether ``exc`` is delta-rs refusing the commit because another writer changed the table's metadata
        since ``table``'s version (``prl maintain`` setting a table property, another prl adding a nullable
        column) while every column of this table's files is still in the table: then ``table`` is brought up to
        date and the same files can be committed against it. An append conflicts with nothing else here."""
        if METADATA_CHANGED not in str(exc):
            return False
        table.update_incremental()
        have = {f.name for f in table.schema().fields}
        return all(f.name in have for f in TABLES[self.table])

    def _own_commit_after(self, exc: OSError | DeltaError, commit_id: str) -> int:
        """The version of this run's commit when it landed although the call failed; else the failure as
        :class:`~prl.errors.RetryableIOError`."""
        where = f"committing to {self.table} in {self.store.uri}"
        try:
            version = self.store.committed_version(self.table, commit_id, exact=True)
        except (OSError, DeltaError, RetryableIOError):
            version = None
        if version is None:
            raise RetryableIOError(f"{where} failed: {describe_error(exc)}") from exc
        log.warning("%s reported %s, but the commit is in the log as version %d", where, describe_error(exc), version)
        return version


def write_files(store: Store, name: str, batches: Iterable[pa.RecordBatch], dry_run: bool = False) -> PendingCommit:
    """Stream ``batches`` into new Parquet files of table ``name`` of ``store`` (invisible until committed).

    Encoding and compression (C++, outside the GIL) run on one writer thread while the caller's generator
    produces the next batch; at most :data:`IN_FLIGHT_BATCHES` wait for it, so memory is bounded by a few
    batches plus the Parquet writer's buffers. A failed write or close stops the writer and the producer at
    once (no thread is left waiting); storage errors are raised as :class:`~prl.errors.RetryableIOError`, and
    the files begun are removed where the store still allows it."""
    pending = PendingCommit(store, name, dry_run=dry_run)
    schema = TABLES[name]
    if dry_run:
        for batch in batches:
            pending.rows += batch.num_rows
        return pending
    store.ensure(name)
    files = _DataFiles(store, name, pending)
    in_flight: deque[Future[None]] = deque()
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"prl-write-{name}") as pool:
            try:
                for batch in batches:
                    if batch.num_rows == 0:
                        continue
                    if batch.schema != schema:
                        batch = pa.RecordBatch.from_arrays(
                            [batch.column(n).cast(schema.field(n).type) for n in schema.names], schema=schema
                        )
                    pending.rows += batch.num_rows
                    in_flight.append(pool.submit(files.write, batch))
                    while len(in_flight) > IN_FLIGHT_BATCHES or (in_flight and in_flight[0].done()):
                        in_flight.popleft().result()  # a failed write raises here, before the next batch
                while in_flight:
                    in_flight.popleft().result()
                pool.submit(files.close_current).result()
            finally:
                for future in in_flight:
                    future.cancel()
    except BaseException as exc:
        files.abandon()
        if isinstance(exc, OSError):
            raise RetryableIOError(f"writing {name} in {store.uri} failed: {describe_error(exc)}") from exc
        raise
    return pending


class _DataFiles:
    """The data files one :func:`write_files` call writes, used by its writer thread only."""

    def __init__(self, store: Store, name: str, pending: PendingCommit) -> None:
        self.store, self.pending = store, pending
        self.schema = TABLES[name]
        self.folder = store.table_path(name)
        self.writer: pq.ParquetWriter | None = None
        self.current: str | None = None
        self.rows = self.nbytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if self.writer is None:
            self.current = f"part-{uuid.uuid4().hex}.zstd.parquet"
            # given a path, the writer owns its stream and closes it (an S3 upload completes on close)
            self.writer = pq.ParquetWriter(
                f"{self.folder}/{self.current}", self.schema, filesystem=self.store.fs, **parquet_options(self.schema)
            )
        self.writer.write_batch(batch)
        self.rows += batch.num_rows
        self.nbytes += batch.nbytes
        if self.nbytes >= TARGET_FILE_BYTES:
            self.close_current()

    def close_current(self) -> None:
        writer, name = self.writer, self.current
        if writer is None or name is None:
            return
        self.writer = None  # a close that fails is not retried: abandon() removes the file
        writer.close()
        size = self.store.fs.get_file_info(f"{self.folder}/{name}").size
        stats = json.dumps({"numRecords": self.rows})
        self.pending.adds.append(AddAction(name, size, {}, int(time.time() * 1000), True, stats))
        self.pending.bytes += size
        self.current, self.rows, self.nbytes = None, 0, 0

    def abandon(self) -> None:
        """After a failure: close what is open and remove every file begun (best effort; never committed, so
        readers never see them either way, and ``vacuum`` removes what is left)."""
        writer, self.writer = self.writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        names = [add.path for add in self.pending.adds] + ([self.current] if self.current else [])
        for file_name in names:
            with contextlib.suppress(Exception):
                self.store.fs.delete_file(f"{self.folder}/{file_name}")
        self.pending.adds.clear()
        self.pending.bytes = 0
