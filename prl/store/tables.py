"""The trace store: Delta Lake tables under a folder or an ``s3://`` prefix.

Every write goes through :meth:`Store.commit`: Parquet files are streamed into the table's folder first
(invisible to readers), then one atomic Delta commit adds them all, carrying the caller's metadata (the source
ledger) and Delta ``txn`` actions (app id → version) that make re-runs recognisable. A run killed before the
commit leaves only unreferenced files, which readers never see and ``vacuum`` removes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from prl.errors import RetryableIOError
from prl.io.locations import (
    aws_endpoint,
    aws_max_retries,
    aws_region,
    filesystem_for,
    is_remote,
    normalise_s3,
    resolved_location,
)
from prl.schema import TABLES
from prl.store import holder
from prl.store.format import mark_new
from prl.store.s3lock import log_object
from prl.store.writer import CommitResult, PendingCommit, describe_error, parquet_options, write_files

T = TypeVar("T")

__all__ = [
    "CHECKPOINT_INTERVAL",
    "TABLE_PROPERTIES",
    "CommitResult",
    "PendingCommit",
    "Store",
    "aws_endpoint",
    "aws_region",
    "describe_error",
    "filesystem_for",
    "is_remote",
    "parquet_options",
    "storage_options",
]

CHECKPOINT_INTERVAL = 10
"""Commits between two Delta checkpoints, which delta-rs writes after the commit whose version + 1 is a multiple
of it (versions 9, 19, …). Opening a table reads its last checkpoint and replays every commit since, and delta-rs
reads each of those commit files twice per open: with its default of 100 an open on S3 costs up to ~200 GETs
before ``prl maintain`` checkpoints again, with 10 at most ~30 (a checkpoint read is ~12 GETs); a commit that
writes a checkpoint costs ~40 requests instead of 7, once in 10 commits. Spark's default is 10 too."""
TABLE_PROPERTIES = {"delta.checkpointInterval": str(CHECKPOINT_INTERVAL)}
"""The Delta table properties prl creates its tables with (``prl maintain --upgrade`` sets them on older tables)."""

READAHEAD_FILES = 2
READAHEAD_BATCHES = 4
"""How far a streaming scan decodes ahead of its consumer (files, and batches within them): enough to keep the
cores busy, little enough that a scan holds a few batches, not Arrow's default of 4 files and 16 batches."""


def scan_options(remote: bool) -> ds.ParquetFragmentScanOptions:
    """Parquet read settings of a streaming scan. Locally, column chunks are read as the scan reaches them
    (``pre_buffer=False``): pre-buffering coalesces and reads every row group of a file up front, so a scan's
    memory followed the size of the files (a compacted 40 M-token store: 264 MB of Arrow buffers against 67 MB).
    On S3, where each read is a request, pre-buffering stays on and memory follows the compacted file size
    (``prl maintain --target-mb``) times :data:`READAHEAD_FILES`."""
    return ds.ParquetFragmentScanOptions(pre_buffer=remote)


def _sized(dataset: ds.FileSystemDataset, folder: pafs.FileSystem, sizes: dict[str, int]) -> ds.FileSystemDataset:
    """``dataset`` with each file's size (``sizes``: from the Delta log, by path) given to its fragment, so that
    a scan does not ask the store for it first (on S3, a HEAD per file and scan)."""
    fmt = dataset.format
    fragments = [
        fmt.make_fragment(
            f.path, filesystem=folder, partition_expression=f.partition_expression, file_size=sizes.get(unquote(f.path))
        )
        for f in dataset.get_fragments()
    ]
    return ds.FileSystemDataset(fragments, dataset.schema, fmt, folder)


def storage_options() -> dict[str, str]:
    """Delta storage options from the standard AWS environment (never from flags; never printed).

    Only non-secret switches are added here (endpoint, region, and the standard ``AWS_MAX_ATTEMPTS`` as
    delta-rs' ``max_retries``, attempts − 1, so that one setting bounds boto3's and delta-rs' retries alike); credentials are read by the object store client itself from
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` / profiles.

    Concurrent writers on S3: a Delta commit is the creation of ``_delta_log/<version>.json``, which must fail
    when another writer created that version first. delta-rs 1.x does this with S3 conditional writes
    (``PutObject`` with ``If-None-Match: *``, supported by AWS S3 since 2024, MinIO, R2 and moto), selected by
    ``conditional_put=etag``; the loser re-reads the log and retries at the next version. No DynamoDB locking
    provider is needed (delta-rs 1.x dropped it), and ``AWS_S3_ALLOW_UNSAFE_RENAME`` must stay unset: it lets two
    writers overwrite each other's commit. Stores whose S3 API lacks conditional writes are not supported.
    """
    opts: dict[str, str] = {}
    endpoint = aws_endpoint()
    if endpoint:
        opts["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    region = aws_region()
    if region:
        opts["AWS_REGION"] = region
    retries = aws_max_retries()
    if retries is not None:
        opts["max_retries"] = str(retries)
    # S3 supports conditional writes (If-None-Match); delta-rs uses them for safe concurrent commits.
    opts.setdefault("conditional_put", "etag")
    return opts


@dataclass
class Store:
    """A folder or ``s3://`` prefix holding prl's Delta tables (``traces``, ``quarantine``, ``rewards``,
    ``ref_logprobs``, ``checks``) and its locks (``_locks/``)."""

    uri: str
    _options: dict[str, str] = field(default_factory=dict, repr=False)
    _pinned: dict[str, tuple[int, DeltaTable]] = field(default_factory=dict, repr=False, compare=False)
    """The table last opened by :meth:`version` per name, with its version: scans of that version reuse it."""
    _pinned_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _sizes: dict[str, tuple[tuple[str, int], dict[str, int]]] = field(default_factory=dict, repr=False, compare=False)
    """Per table, the table id and version last asked about and the bytes of each data file of its snapshot, by path (read
    from a table this store opened; a version's files never change)."""
    _runs: threading.local = field(default_factory=threading.local, repr=False, compare=False)
    """Per thread, a stack of the tables each :meth:`one_run` block keeps (name → table at its latest version as
    last seen)."""

    def __post_init__(self) -> None:
        self.uri = normalise_s3(self.uri) if self.uri.startswith("s3://") else self.uri.rstrip("/")
        if not is_remote(self.uri):
            self.uri = os.path.abspath(self.uri.removeprefix("file://"))
            if os.path.exists(self.uri) and not os.path.isdir(self.uri):
                raise RetryableIOError(f"store {self.uri} is not a folder")
        self._options = storage_options() if self.uri.startswith("s3://") else {}
        self.fs, self.root = filesystem_for(self.uri)
        self.scan_options = scan_options(is_remote(self.uri))
        """How this store's streaming scans read Parquet (:func:`scan_options`)."""

    # --- paths -------------------------------------------------------------------------------------------
    @property
    def location(self) -> str:
        """The store's resolved location (its real path, or the normalised ``s3://bucket/prefix``): what its
        locks are keyed by."""
        return resolved_location(self.uri)

    def table_uri(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def table_path(self, name: str) -> str:
        """The table folder inside :attr:`fs`."""
        return f"{self.root}/{name}"

    @property
    def options(self) -> dict[str, str]:
        """Storage options for deltalake / polars (``storage_options=``)."""
        return dict(self._options)

    # --- reading -----------------------------------------------------------------------------------------
    def open(self, name: str, version: int | None = None) -> DeltaTable | None:
        """The table at its latest (or a given) version; None when it does not exist yet."""
        try:
            return DeltaTable(self.table_uri(name), version=version, storage_options=self._options or None)
        except TableNotFoundError:
            return None
        except OSError as exc:  # network and permission errors from the object store
            raise RetryableIOError(f"cannot open table {name!r} in {self.uri}: {describe_error(exc)}") from exc

    @contextlib.contextmanager
    def one_run(self) -> Iterator[None]:
        """Keep the tables :meth:`latest` opens in this thread until the block ends: the block is one command's
        run (its lock held), which so replays each table's log once instead of once per look.

        Each block keeps tables of its own, and forgets them when it ends: a view is never used past the run
        (and the lock) it was read under, where the table may have been re-created or its log cleaned up."""
        stack: list[dict[str, DeltaTable]] = self._runs.__dict__.setdefault("stack", [])
        stack.append({})
        try:
            yield
        finally:
            stack.pop()

    def latest(self, name: str, *, refresh: bool = True) -> DeltaTable | None:
        """The table at its latest version, as :meth:`open` gives it; None when it does not exist yet.

        Inside :meth:`one_run` the table is opened once (its checkpoint and every commit since) and kept; each
        later call brings the kept table up to date (``update_incremental``: a listing of the log after its
        version and the commits found there), so it sees exactly what a fresh open would. ``refresh=False``
        hands back the kept table as it was last brought up to date (or written to) in this run, with no
        request; the caller's docstring says why missing another writer's newest commits cannot make its
        answer wrong. Outside a run every call opens the table afresh."""
        stack = self._runs.__dict__.get("stack")
        if not stack:
            return self.open(name)
        kept = stack[-1]
        table = kept.get(name)
        if table is None:
            table = self.open(name)
            if table is not None:
                kept[name] = table
        elif refresh:
            try:
                table.update_incremental()
            except OSError as exc:
                raise RetryableIOError(f"cannot read table {name!r} in {self.uri}: {describe_error(exc)}") from exc
        return table

    def version_seen(self, name: str) -> int | None:
        """The version of ``name`` this run last saw, after its own last commit to it (:meth:`latest` with
        ``refresh=False``): what a run's summary reports. A later commit of another writer is not this run's
        doing, so missing it is no error there."""
        table = self.latest(name, refresh=False)
        return None if table is None else table.version()

    def _keep(self, name: str, table: DeltaTable) -> DeltaTable:
        """Keep ``table`` (just created, or opened after a schema change) as the run's view of ``name``."""
        stack = self._runs.__dict__.get("stack")
        if stack:
            stack[-1][name] = table
        return table

    def at(self, name: str, version: int) -> DeltaTable | None:
        """The table at ``version``: the one :meth:`version` opened at it when that is the version it found (a
        snapshot: never brought up to date), else opened at it."""
        with self._pinned_lock:
            pinned = self._pinned.get(name)
        if pinned is not None and pinned[0] == version:
            return pinned[1]
        return self.open(name, version)

    def read_at(self, name: str, version: int, read: Callable[[DeltaTable], T]) -> T | None:
        """``read(table)`` of the table at ``version`` (:meth:`at`; None when it does not exist), called under the
        lock that keeps a pinned table to one thread at a time, as :meth:`dataset` uses it."""
        table = self.at(name, version)
        if table is None:
            return None
        with self._pinned_lock:
            return read(table)

    def version(self, name: str) -> int | None:
        """The table's current version (None when it does not exist yet); the table opened at it is kept for
        :meth:`dataset` to reuse, so that reading a pinned version does not replay the log again."""
        table = self.open(name)
        if table is None:
            return None
        version = table.version()
        with self._pinned_lock:
            self._pinned[name] = (version, table)
        return version

    def versions(self) -> dict[str, int | None]:
        """Current version of every table (None where a table does not exist yet); the tables are opened side by
        side (opening mostly waits on reading the Delta log)."""
        with ThreadPoolExecutor(max_workers=len(TABLES)) as pool:
            return dict(zip(TABLES, pool.map(self.version, TABLES), strict=True))

    def dataset(self, name: str, version: int | None = None) -> ds.Dataset | None:
        """A pyarrow dataset over the table's files at one version, for streaming scans.

        Files are read through :attr:`fs` (pyarrow's own local or S3 filesystem, which reads without the GIL),
        rooted at the table folder where the Delta log names them.

        Without ``version``, the table at its latest version (:meth:`latest`: inside a run, the kept table
        brought up to date).
        """
        table = self.latest(name) if version is None else self.at(name, version)
        if table is None:
            return None
        folder = pafs.SubTreeFileSystem(self.table_path(name), self.fs)
        with self._pinned_lock:  # a DeltaTable object is used by one thread at a time
            dataset = table.to_pyarrow_dataset(filesystem=folder)
        return _sized(dataset, folder, self.file_sizes(name, table))

    def file_sizes(self, name: str, table: DeltaTable) -> dict[str, int]:
        """Bytes of each data file of ``table``'s snapshot (path relative to the table folder, decoded), from its
        add actions; kept for the table's latest version asked about (and its table id: a table dropped and
        created again starts at version 0 with other files)."""
        with self._pinned_lock:
            snapshot = (str(table.metadata().id), table.version())
            kept = self._sizes.get(name)
            if kept is not None and kept[0] == snapshot:
                return kept[1]
            files = pa.table(table.get_add_actions()).select(["path", "size_bytes"]).to_pylist()
            sizes = {unquote(f["path"]): int(f["size_bytes"]) for f in files}
            self._sizes[name] = (snapshot, sizes)
        return sizes

    def known_sizes(self, name: str) -> dict[str, int]:
        """Bytes of each data file of the snapshot of ``name`` this store holds (:meth:`file_sizes`): the one
        :meth:`version` pinned, else inside a run the kept table as last seen; empty when it holds none. No
        request: reading a file of known size skips asking the store for it (on S3 a HEAD per file)."""
        with self._pinned_lock:
            pinned = self._pinned.get(name)
        table = pinned[1] if pinned is not None else None
        stack = self._runs.__dict__.get("stack")
        if table is None and stack:
            table = stack[-1].get(name)
        return {} if table is None else self.file_sizes(name, table)

    def scan(
        self,
        name: str,
        columns: list[str] | None = None,
        filter: ds.Expression | None = None,
        batch_size: int = 4096,
        version: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Stream record batches of a table (nothing when it does not exist). Memory is bounded by
        ``batch_size`` rows, not by the table."""
        dataset = self.dataset(name, version)
        if dataset is None:
            return
        yield from dataset.to_batches(
            columns=columns,
            filter=filter,
            batch_size=batch_size,
            fragment_scan_options=self.scan_options,
            batch_readahead=READAHEAD_BATCHES,
            fragment_readahead=READAHEAD_FILES,
        )

    def read(
        self,
        name: str,
        columns: list[str] | None = None,
        filter: ds.Expression | None = None,
        version: int | None = None,
    ) -> pa.Table:
        """A (filtered, projected) table; for small selections only. Empty with the table schema if absent."""
        dataset = self.dataset(name, version)
        if dataset is None:
            schema = TABLES[name]
            if columns is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table()
        return dataset.to_table(columns=columns, filter=filter)

    def transaction_version(self, name: str, app_id: str) -> int | None:
        """The Delta ``txn`` version recorded for ``app_id`` in table ``name`` (None if never committed)."""
        table = self.open(name)
        return None if table is None else table.transaction_version(app_id)

    # --- writing -----------------------------------------------------------------------------------------
    def ensure(self, name: str) -> DeltaTable:
        """The table to write to, created empty with its schema when missing (idempotent, race-safe).

        Inside a run this is the kept table as last brought up to date (:meth:`latest` with ``refresh=False``):
        its callers need the table to exist with prl's columns, and a table to commit to. A kept view that
        misses other writers' newest commits cannot make either wrong: a table once there stays there for the
        run, its columns are those of the store's format (:mod:`prl.store.format`), and a commit against an
        older version retries past the newer ones (its write of the next version fails, delta-rs checks the
        commits that won for conflicts and commits after them), as any writer slower than another does."""
        table = self.latest(name, refresh=False)
        if table is not None:
            return table
        holder.ensure_held(self.location)  # creating a table is a commit too
        mark_new(self)  # the store's format is recorded before its first table
        try:
            table = DeltaTable.create(
                self.table_uri(name),
                TABLES[name],
                mode="ignore",
                storage_options=self._options or None,
                name=name,
                configuration=TABLE_PROPERTIES,
            )
        except (OSError, DeltaError) as exc:
            table = self.open(name)  # another process created it first
            if table is None:
                raise RetryableIOError(f"creating table {name!r} in {self.uri} failed: {describe_error(exc)}") from exc
        return self._keep(name, table)

    def write_files(self, name: str, batches: Iterable[pa.RecordBatch], dry_run: bool = False) -> PendingCommit:
        """Stream ``batches`` into new Parquet files of table ``name`` (invisible until committed; see
        :func:`prl.store.writer.write_files`). Nothing is visible to readers until the returned
        :meth:`PendingCommit.commit`."""
        return write_files(self, name, batches, dry_run=dry_run)

    def commit(
        self,
        name: str,
        batches: Iterable[pa.RecordBatch],
        metadata: Mapping[str, Any] | None = None,
        transactions: Mapping[str, int] | None = None,
        dry_run: bool = False,
    ) -> CommitResult:
        """Append ``batches`` to table ``name`` in one atomic commit (see :meth:`write_files` and
        :meth:`PendingCommit.commit`)."""
        return self.write_files(name, batches, dry_run=dry_run).commit(metadata, transactions)

    def log_file(self, name: str, file: str) -> bytes | None:
        """The body of ``_delta_log/<file>`` of table ``name`` (a commit ``<version:020>.json``,
        ``_last_checkpoint``); None when there is no such file (:meth:`file_bytes`)."""
        return self.file_bytes(name, f"_delta_log/{file}")

    def file_bytes(self, name: str, file: str) -> bytes | None:
        """The body of file ``file`` (a path inside the folder of table ``name``); None when there is no such
        file. On S3 it is one GET (pyarrow's filesystem asks for an object's size before reading it: a HEAD more
        per file)."""
        if self.uri.startswith("s3://"):
            return log_object(self.uri, f"{name}/{file}")
        try:
            with self.fs.open_input_stream(f"{self.table_path(name)}/{file}") as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def log_entry(self, name: str, version: int) -> bytes | None:
        """The body of commit ``version`` of table ``name`` (:meth:`log_file`); None when it is not there."""
        return self.log_file(name, f"{version:020d}.json")

    def committed_version(
        self, name: str, commit_id: str, window: int = 256, exact: bool = False, latest: int | None = None
    ) -> int | None:
        """The version of table ``name`` whose commit carries ``prl.commit_id``: the newest ``window`` commit
        files are read from the newest down (other writers may have committed after it; ``history()`` numbers
        entries unreliably while the log grows), from ``latest`` when the caller knows the table's latest
        version (else the table is opened to learn it). Not found: the latest version, or None when ``exact``."""
        if latest is None:
            table = self.open(name)
            if table is None:
                return None
            latest = table.version()
        needle = commit_id.encode()
        for version in range(latest, max(-1, latest - window), -1):
            body = self.log_entry(name, version)
            if body is not None and needle in body:
                return version
        return None if exact else latest
