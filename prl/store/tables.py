"""The trace store: Delta Lake tables under a folder or an ``s3://`` prefix.

Every write goes through :meth:`Store.commit`: Parquet files are streamed into the table's folder first
(invisible to readers), then one atomic Delta commit adds them all, carrying the caller's metadata (the source
ledger) and Delta ``txn`` actions (app id → version) that make re-runs recognisable. A run killed before the
commit leaves only unreferenced files, which readers never see and ``vacuum`` removes.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction

from prl.errors import RetryableIOError
from prl.schema import TABLES, float_leaves, leaf_paths

TARGET_FILE_BYTES = 128 * 1024 * 1024
"""Uncompressed Arrow bytes after which a data file is closed and a new one begun."""
READAHEAD_FILES = 2
READAHEAD_BATCHES = 4
"""How far a streaming scan decodes ahead of its consumer (files, and batches within them): enough to keep the
cores busy, little enough that a scan holds a few batches, not Arrow's default of 4 files and 16 batches."""


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


def aws_endpoint() -> str | None:
    """The S3 endpoint URL from the standard environment (``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def aws_region() -> str | None:
    """The AWS region from the standard environment (``AWS_REGION``, then ``AWS_DEFAULT_REGION``)."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def storage_options() -> dict[str, str]:
    """Delta storage options from the standard AWS environment (never from flags; never printed).

    Only non-secret switches are added here; credentials are read by the object store client itself from
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
    # S3 supports conditional writes (If-None-Match); delta-rs uses them for safe concurrent commits.
    opts.setdefault("conditional_put", "etag")
    return opts


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe_error(exc: BaseException) -> str:
    """One plain line for a storage error: delta-rs prints its chain of causes on coloured lines."""
    parts = (line.strip().lstrip("↳").strip() for line in _ANSI.sub("", str(exc)).splitlines())
    return " ← ".join(part for part in parts if part)


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def filesystem_for(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it for a local path or an ``s3://`` URI."""
    if uri.startswith("s3://"):
        endpoint = aws_endpoint()
        kwargs: dict[str, Any] = {}
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            kwargs["endpoint_override"] = host.rstrip("/")
            kwargs["scheme"] = scheme
        region = aws_region()
        if region:
            kwargs["region"] = region
        return pafs.S3FileSystem(**kwargs), uri[len("s3://") :].rstrip("/")
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    return pafs.LocalFileSystem(), os.path.abspath(uri)


@dataclass
class CommitResult:
    """What one :meth:`Store.commit` did. ``version`` is None when there was nothing to commit."""

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
        no transactions, nothing is committed."""
        if self.dry_run or (not self.adds and not transactions):
            return CommitResult(self.table, None, self.rows, len(self.adds), self.bytes)
        custom = {f"prl.{key}": json.dumps(value, sort_keys=True) for key, value in (metadata or {}).items()}
        commit_id = uuid.uuid4().hex  # finds this commit's version when other writers commit right after it
        custom["prl.commit_id"] = json.dumps(commit_id)
        props = CommitProperties(
            custom_metadata=custom,
            app_transactions=[Transaction(app_id, version) for app_id, version in (transactions or {}).items()],
            max_commit_retries=50,
        )
        table = self.store.ensure(self.table)
        try:
            table.create_write_transaction(self.adds, "append", TABLES[self.table], commit_properties=props)  # type: ignore[arg-type]
        except OSError as exc:
            raise RetryableIOError(
                f"committing to {self.table} in {self.store.uri} failed: {describe_error(exc)}"
            ) from exc
        version = self.store.committed_version(self.table, commit_id)
        return CommitResult(self.table, version, self.rows, len(self.adds), self.bytes)


@dataclass
class Store:
    """A folder or ``s3://`` prefix holding prl's Delta tables (``traces``, ``quarantine``, ``rewards``,
    ``ref_logprobs``, ``checks``) and its locks (``_locks/``)."""

    uri: str
    _options: dict[str, str] = field(default_factory=dict, repr=False)
    _pinned: dict[str, tuple[int, DeltaTable]] = field(default_factory=dict, repr=False, compare=False)
    """The table last opened by :meth:`version` per name, with its version: scans of that version reuse it."""
    _pinned_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.uri = self.uri.rstrip("/")
        if not is_remote(self.uri):
            self.uri = os.path.abspath(self.uri.removeprefix("file://"))
            if os.path.exists(self.uri) and not os.path.isdir(self.uri):
                raise RetryableIOError(f"store {self.uri} is not a folder")
        self._options = storage_options() if self.uri.startswith("s3://") else {}
        self.fs, self.root = filesystem_for(self.uri)

    # --- paths -------------------------------------------------------------------------------------------
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
        """
        with self._pinned_lock:
            pinned = self._pinned.get(name)
        if version is not None and pinned is not None and pinned[0] == version:
            table = pinned[1]
        else:
            table = self.open(name, version)  # type: ignore[assignment]
            if table is None:
                return None
        with self._pinned_lock:  # a DeltaTable object is used by one thread at a time
            return table.to_pyarrow_dataset(filesystem=pafs.SubTreeFileSystem(self.table_path(name), self.fs))

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
        """Open the table, creating it empty with its schema when missing (idempotent, race-safe)."""
        table = self.open(name)
        if table is not None:
            return table
        try:
            return DeltaTable.create(
                self.table_uri(name),
                TABLES[name],
                mode="ignore",
                storage_options=self._options or None,
                name=name,
            )
        except Exception:
            table = self.open(name)  # another process created it first
            if table is None:
                raise
            return table

    def write_files(self, name: str, batches: Iterable[pa.RecordBatch], dry_run: bool = False) -> PendingCommit:
        """Stream ``batches`` into new Parquet files of table ``name`` (invisible until committed).

        Memory is bounded by one batch plus the Parquet writer's buffers. Returns a :class:`PendingCommit`;
        nothing is visible to readers until its :meth:`PendingCommit.commit`.
        """
        schema = TABLES[name]
        pending = PendingCommit(self, name, dry_run=dry_run)
        writer: pq.ParquetWriter | None = None
        current: str | None = None
        current_rows = current_bytes = 0
        table_dir = self.table_path(name)
        if not dry_run:
            self.ensure(name)

        def close_current() -> None:
            nonlocal writer, current, current_rows, current_bytes
            if writer is None or current is None:
                return
            writer.close()
            size = self.fs.get_file_info(f"{table_dir}/{current}").size
            stats = json.dumps({"numRecords": current_rows})
            pending.adds.append(AddAction(current, size, {}, int(time.time() * 1000), True, stats))
            pending.bytes += size
            writer, current, current_rows, current_bytes = None, None, 0, 0

        def write_one(batch: pa.RecordBatch) -> None:
            nonlocal writer, current, current_rows, current_bytes
            if writer is None:
                current = f"part-{uuid.uuid4().hex}.zstd.parquet"
                # given a path, the writer owns its stream and closes it (an S3 upload completes on close)
                writer = pq.ParquetWriter(
                    f"{table_dir}/{current}", schema, filesystem=self.fs, **parquet_options(schema)
                )
            writer.write_batch(batch)
            current_rows += batch.num_rows
            current_bytes += batch.nbytes
            if current_bytes >= TARGET_FILE_BYTES:
                close_current()

        # Encoding and compression (C++, outside the GIL) run on a writer thread while the caller's generator
        # produces the next batch; the queue holds at most two batches, so memory stays bounded.
        handoff: queue.Queue[pa.RecordBatch | None] = queue.Queue(maxsize=2)
        failure: list[BaseException] = []

        def drain() -> None:
            try:
                while (batch := handoff.get()) is not None:
                    if not failure:
                        write_one(batch)
                close_current()
            except BaseException as exc:  # reported to the caller below
                failure.append(exc)
                while handoff.get() is not None:  # keep the producer unblocked
                    pass

        thread = threading.Thread(target=drain, name=f"prl-write-{name}", daemon=True)
        if not dry_run:
            thread.start()
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if batch.schema != schema:
                    batch = pa.RecordBatch.from_arrays(
                        [batch.column(n).cast(schema.field(n).type) for n in schema.names], schema=schema
                    )
                pending.rows += batch.num_rows
                if dry_run or failure:
                    continue
                handoff.put(batch)
        finally:
            if not dry_run:
                handoff.put(None)
                thread.join()
            if writer is not None:  # an exception mid-file: the stray file is never added to the log
                writer.close()
        if failure:
            exc = failure[0]
            if isinstance(exc, OSError):
                raise RetryableIOError(f"writing {name} in {self.uri} failed: {exc}") from exc
            raise exc
        return pending

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

    def committed_version(self, name: str, commit_id: str, window: int = 256) -> int | None:
        """The version of table ``name`` whose commit carries ``prl.commit_id``: the newest ``window`` commit
        files are read from the newest down (other writers may have committed after it; ``history()`` numbers
        entries unreliably while the log grows)."""
        table = self.open(name)
        if table is None:
            return None
        latest = table.version()
        needle = commit_id.encode()
        for version in range(latest, max(-1, latest - window), -1):
            try:
                with self.fs.open_input_stream(f"{self.table_path(name)}/_delta_log/{version:020d}.json") as log:
                    if needle in log.read():
                        return version
            except FileNotFoundError:
                continue
        return latest

    def commit_info(self, name: str, limit: int | None = None) -> list[dict[str, Any]]:
        """Commit infos, newest first, with ``prl.*`` metadata decoded from JSON."""
        table = self.open(name)
        if table is None:
            return []
        out = []
        for entry in table.history(limit):
            decoded = dict(entry)
            for key, value in entry.items():
                if key.startswith("prl.") and isinstance(value, str):
                    try:
                        decoded[key] = json.loads(value)
                    except ValueError:
                        pass
            out.append(decoded)
        return out
