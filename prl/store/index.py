"""Key indexes: exact ``id → value`` lookups whose cost follows the keys asked, not the table indexed.

The sample index (``sample_id → record_digest`` of ``traces``) is described here; the event indexes of the side
tables (``event_id → sample_id`` of ``rewards`` and ``ref_logprobs``, :data:`EVENT_INDEXES`) work the same way,
each under its own table's writers.

The index is a Delta table, ``STORE/_index/traces_keys``, with one row per traces row: ``key`` (a 64-bit
blake2b of the sample ID), ``sample_id`` and ``record_digest``. A lookup reads only the ``key`` column (8 bytes
per stored sample, not the traces files; held sorted in memory for the run), and reads IDs and digests only
for the row groups holding a key that matched, so a batch costs a binary search per new key.

Never a false "present": the index is derived from committed traces rows only. Its commits carry a Delta
``txn`` (``prl.index.traces:<traces table id>`` → the traces version it covers); rows of a traces commit are
added after that commit, and a run that finds the index behind (a run killed between the two commits, an index
removed) first adds the rows of the traces commits it is missing, found in the Delta log
(:func:`prl.store.changes.added_files`), or rebuilds it from the whole snapshot when the log no longer has them
or the traces table was re-created (its table id changed). Writers of ``traces`` hold the store's ``ingest``
lock, so index commits follow traces commits one by one.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import CommitProperties, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import DeltaError

from prl.errors import RetryableIOError
from prl.store.changes import added_files, files_dataset, snapshot_files
from prl.store.tables import TABLE_PROPERTIES, Store, describe_error
from prl.store.writer import METADATA_CHANGED

log = logging.getLogger(__name__)

INDEX_TABLE = "_index/traces_keys"
KEYS = pa.schema(
    [
        pa.field("key", pa.int64(), nullable=False),
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("record_digest", pa.string(), nullable=False),
    ]
)
"""One row per traces row. ``key`` is the first 8 bytes of blake2b(sample_id), big-endian, as int64."""
ROW_GROUP_ROWS = 16_384
"""Rows per row group of an index file: the key statistics of a sorted file prune to about this many rows."""
READ_BATCH = 65_536
WHOLE_FILE_BYTES = 1 << 20
"""Index files up to this size are read whole, in one request (on S3 in-region, where transfer is free, one
GET saved is worth more than a MiB more read; each request also costs a round trip); a larger one is read as its
footer and its key column."""


def sample_keys(sample_ids: Iterable[str]) -> np.ndarray:
    """int64[N] keys of sample IDs (first 8 bytes of blake2b, big-endian, two's complement)."""
    digests = b"".join(hashlib.blake2b(s.encode(), digest_size=8).digest() for s in sample_ids)
    return np.frombuffer(digests, dtype=">i8").astype(np.int64)


def key_batch(sample_ids: pa.Array, digests: pa.Array, schema: pa.Schema = KEYS) -> pa.RecordBatch:
    """Index rows for aligned id (``sample_ids``) and value (``digests``) string arrays, sorted by key."""
    keys = sample_keys(sample_ids.to_pylist())
    order = np.argsort(keys, kind="stable")
    return pa.RecordBatch.from_arrays(
        [pa.array(keys[order]), sample_ids.take(order), digests.take(order)], schema=schema
    )


def _pair(batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
    """The (id, value) arrays of a batch of an :class:`IndexSpec`'s ``columns``."""
    return batch.column(0), batch.column(1)


@dataclass(frozen=True)
class IndexSpec:
    """What one index covers: ``table`` indexed into ``index_table``, whose rows are (``key``, ``id``,
    ``value``) as ``schema`` names them; ``rows`` makes (id, value) arrays of a batch of ``columns`` of
    ``table``; ``app`` names the index's Delta txn (``prl.index.<app>:<table id>``)."""

    table: str
    index_table: str
    schema: pa.Schema
    columns: tuple[str, ...]
    rows: Callable[[pa.RecordBatch], tuple[pa.Array, pa.Array]]
    app: str


def _event_schema() -> pa.Schema:
    fields = [("key", pa.int64()), ("event_id", pa.string()), ("sample_id", pa.string())]
    return pa.schema([pa.field(name, typ, nullable=False) for name, typ in fields])


TRACES_INDEX = IndexSpec("traces", INDEX_TABLE, KEYS, ("sample_id", "record_digest"), _pair, "traces")
EVENT_INDEXES = {
    table: IndexSpec(
        table,
        f"_index/{table}_events",
        _event_schema(),
        ("event_id", "sample_id"),
        _pair,
        table,
    )
    for table in ("rewards", "ref_logprobs")
}
"""The side tables' indexes: ``event_id`` (a content digest, see :mod:`prl.event_ids`) → ``sample_id``."""
INDEX_TABLES = (INDEX_TABLE, *(spec.index_table for spec in EVENT_INDEXES.values()))


@dataclass(frozen=True)
class IndexView:
    """The state of a :class:`SampleIndex` that its lookups depend on besides the index table: the traces version
    it covers and the rows it holds in memory (a dry run's, sample_id → record_digest)."""

    covered: int | None
    pending: dict[str, str]


class SampleIndex:
    """Exact lookups of ids in an indexed table (see the module docstring; by default sample IDs in ``traces``).
    ``write=False`` (a dry run) keeps the rows of unindexed commits in memory instead of committing them."""

    def __init__(self, store: Store, *, write: bool = True, spec: IndexSpec = TRACES_INDEX) -> None:
        self.store = store
        self.write = write
        self.spec = spec
        self.covered: int | None = None
        """The traces version the index (with :attr:`pending`) covers; None before :meth:`refresh`."""
        self.app_id: str | None = None
        self.pending: dict[str, str] = {}
        self._files: dict[str, _KeyFile | None] = {}

    # --- keeping up with traces --------------------------------------------------------------------------
    def refresh(self, *, rebuild: bool = False) -> None:
        """Bring the index up to the current traces version (a no-op when it already is); ``rebuild``: write it
        again from the whole snapshot, whatever it covers (after the indexed table's rows were rewritten).

        Both tables are looked at as a fresh open would show them (:meth:`Store.latest`: in a run, the kept
        tables brought up to date, one listing each)."""
        spec = self.spec
        traces = self.store.latest(spec.table)
        if traces is None:
            return
        version = traces.version()
        self.app_id = f"prl.index.{spec.app}:{traces.metadata().id}"
        index = self.store.latest(spec.index_table)
        covered = None if index is None else index.transaction_version(self.app_id)
        if self.covered is not None and self.covered > (covered if covered is not None else -1):
            covered = self.covered  # rows this dry run holds in memory
        if covered is not None and covered >= version and not rebuild:
            self.covered = covered
            self._open()
            return
        paths = None if covered is None or rebuild else added_files(self.store, spec.table, covered, version)
        rebuild = paths is None
        if paths is None:
            paths = snapshot_files(self.store, spec.table, version)

        def rows() -> Iterator[pa.RecordBatch]:  # read again if the commit must be made once more
            return _rows_of(files_dataset(self.store, spec.table, paths), spec)

        if self.write:
            self._commit(rows, version, overwrite=rebuild)
        else:
            if rebuild:
                self.pending.clear()
            for batch in rows():
                self.pending.update(zip(batch.column(1).to_pylist(), batch.column(2).to_pylist(), strict=True))
            self.covered = version
            if rebuild:
                self._files = {}
                return
        self._open()

    def committed(self, version: int | None, rows: Mapping[str, str]) -> None:
        """Record the rows (sample_id → record_digest) that traces commit ``version`` added."""
        if version is None:
            return
        if self.covered is not None and self.covered == version - 1 and rows:
            ids = pa.array(list(rows), pa.string())
            digests = pa.array(list(rows.values()), pa.string())
            if self.write:
                self._commit(lambda: [key_batch(ids, digests, self.spec.schema)], version, overwrite=False)
                self._open()
            else:
                self.pending.update(rows)
                self.covered = version
            return
        self.refresh()

    def view(self) -> IndexView:
        """What another process needs to answer the same lookups as this index now (:meth:`adopt`; the rows a
        dry run holds are shared, not copied: the view is sent before they change, and :meth:`adopt` copies)."""
        return IndexView(self.covered, self.pending)

    def adopt(self, view: IndexView) -> None:
        """Answer lookups as the index ``view`` was taken from does (read-only: ``write`` must be False); index
        files loaded before are kept."""
        assert not self.write, "an adopted index never commits"
        self.covered, self.pending = view.covered, dict(view.pending)
        self._open()

    def _commit(self, rows: Callable[[], Iterable[pa.RecordBatch]], version: int, *, overwrite: bool) -> None:
        """Commit index rows covering ``version`` of the indexed table (``rows()`` gives them; called again when
        the first try met another writer's metadata commit, which it is then made after). A commit that landed
        although the call failed (the checkpoint delta-rs writes after every tenth commit failed, say) counts as
        done. In a run the commit is made on the kept
        index table, which it leaves at the version committed (no reopening): an append made against an older
        version retries past newer ones as any commit does (:meth:`Store.ensure`); an overwrite removes the
        files of the version it is made against, so that is brought up to date first."""
        assert self.app_id is not None
        table = self.store.latest(self.spec.index_table, refresh=overwrite)
        props = CommitProperties(
            app_transactions=[Transaction(self.app_id, version)],
            custom_metadata={"prl.operation": "index", f"prl.{self.spec.table}_version": str(version)},
            max_commit_retries=50,
        )
        for attempt in range(2):
            try:
                write_deltalake(
                    self.store.table_uri(self.spec.index_table) if table is None else table,
                    pa.RecordBatchReader.from_batches(self.spec.schema, iter(rows())),
                    mode="overwrite" if overwrite else "append",
                    storage_options=self.store.options or None,
                    configuration=TABLE_PROPERTIES if table is None else None,  # a new index table's
                    commit_properties=props,
                    writer_properties=WriterProperties(compression="ZSTD", max_row_group_size=ROW_GROUP_ROWS),
                )
                break
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # OSError, or a panic of the Rust writer (a full disk): retryable
                if self._landed(version):  # the commit is in the log (a checkpoint after it failed, say)
                    log.warning("indexing %s reported %s, but the commit is in the log", self.spec.table, exc)
                    self.store.latest(self.spec.index_table)  # the kept table may not have moved: lookups load it
                    break
                if attempt == 0 and table is not None and METADATA_CHANGED in str(exc):
                    table = self.store.latest(self.spec.index_table)  # another writer's metadata commit: once more
                    continue
                raise RetryableIOError(
                    f"writing the {self.spec.table} index of {self.store.uri} failed: {describe_error(exc)}"
                ) from exc
        self.covered = version

    def _landed(self, version: int) -> bool:
        """Whether the index table, opened afresh, records this index's transaction at ``version`` or later."""
        try:
            fresh = self.store.open(self.spec.index_table)
            landed = None if fresh is None else fresh.transaction_version(self.app_id or "")
            return landed is not None and landed >= version
        except (OSError, DeltaError, RetryableIOError):
            return False

    def _open(self) -> None:
        """Load the sorted keys of index files not loaded yet; forget files the snapshot no longer has.

        The index table is the run's kept one, as :meth:`refresh` just brought it up to date or :meth:`_commit`
        left it (no request; outside a run, opened afresh). Only writers holding the indexed table's lock (this
        run) add index rows; a compaction committed since rewrites rows the files seen still hold (replaced files
        stay for the retention window), so lookups answer the same."""
        table = self.store.latest(self.spec.index_table, refresh=False)
        if table is None:
            self._files = {}
            return
        sizes = self.store.file_sizes(self.spec.index_table, table)
        name, columns = self.spec.index_table, list(self.spec.schema.names[1:])
        self._files = {
            p: self._files.get(p) or _KeyFile.load(self.store, name, p, size, columns) for p, size in sizes.items()
        }

    # --- lookups -----------------------------------------------------------------------------------------
    def holds_nothing(self) -> bool:
        """True when the index has no entry at all (no file, nothing pending): every lookup finds nothing."""
        return not self._files and not self.pending

    def lookup(self, sample_ids: list[str]) -> dict[str, str]:
        """``id → value`` for those of ``sample_ids`` (ids) that are in the table (as of :attr:`covered`).

        Each index file's keys are held sorted in memory (12 bytes per stored sample, read once per run), so a
        batch costs a binary search per key and file; IDs and digests are read only for the row groups holding
        a matching key, and compared exactly."""
        found = {sid: self.pending[sid] for sid in sample_ids if sid in self.pending} if self.pending else {}
        if not self._files or not sample_ids:
            return found
        keys = sample_keys(sample_ids)
        wanted = set(sample_ids)
        for entry in self._files.values():
            assert entry is not None
            for sid, digest in entry.rows_for(self.store, keys):
                if sid in wanted:
                    found[sid] = digest
        return found


@dataclass
class _KeyFile:
    """One index file: its keys sorted (``keys_K``), each key's row (``rows_K``; None when the file is sorted
    by key already, as prl writes and maintains them), and row-group starts."""

    table: str
    file: str
    """The index table, and the file's path in its folder (as its log names it, decoded)."""
    fragment: ds.ParquetFileFragment | None
    """A file over :data:`WHOLE_FILE_BYTES` at the size the Delta log gives, its footer read, so that reading
    its row groups asks the store for neither again (on S3, no HEAD); None for a file read whole."""
    metadata: pq.FileMetaData
    keys_K: np.ndarray
    rows_K: np.ndarray | None
    group_starts: np.ndarray
    columns: list[str]
    """The id and value columns."""

    @classmethod
    def load(cls, store: Store, table: str, file: str, size: int, columns: list[str]) -> _KeyFile:
        """The keys of index file ``file`` of ``table`` (``size`` bytes). On S3 a file of up to
        :data:`WHOLE_FILE_BYTES` (the per-commit files of small runs) is one GET,
        a larger one a GET of its footer and one of its key column."""
        fragment = None
        if size <= WHOLE_FILE_BYTES:
            parquet = pq.ParquetFile(_whole(store, table, file))
            keys, metadata = parquet.read(columns=["key"]).column("key").to_numpy(), parquet.metadata
        else:
            path = f"{store.table_path(table)}/{file}"
            fragment = ds.ParquetFileFormat().make_fragment(path, filesystem=store.fs, file_size=size)
            fragment.ensure_complete_metadata()
            keys, metadata = fragment.to_table(columns=["key"]).column("key").to_numpy(), fragment.metadata
        sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        starts = np.concatenate(([0], np.cumsum(sizes)))
        if len(keys) < 2 or bool((keys[1:] >= keys[:-1]).all()):  # per-commit files and maintained ones
            return cls(table, file, fragment, metadata, keys, None, starts, columns)
        order = np.argsort(keys, kind="stable")
        return cls(table, file, fragment, metadata, keys[order], order.astype(np.int32), starts, columns)

    def read_groups(self, store: Store, groups: list[int]) -> pa.Table:
        """The id and value columns of row groups ``groups`` (on S3 one GET: of the whole file when it is small)."""
        if self.fragment is None:
            parquet = pq.ParquetFile(_whole(store, self.table, self.file), metadata=self.metadata)
            return parquet.read_row_groups(groups, columns=self.columns)
        return self.fragment.subset(row_group_ids=groups).to_table(columns=self.columns)

    def rows_for(self, store: Store, probe_N: np.ndarray) -> list[tuple[str, str]]:
        """(id, value) of this file's rows whose key is in ``probe_N``."""
        if not len(self.keys_K):
            return []
        at = np.searchsorted(self.keys_K, probe_N)
        hit = at < len(self.keys_K)
        hit[hit] = self.keys_K[at[hit]] == probe_N[hit]
        if not hit.any():
            return []
        lo = np.searchsorted(self.keys_K, probe_N[hit], side="left")
        hi = np.searchsorted(self.keys_K, probe_N[hit], side="right")
        spans = [np.arange(a, b) for a, b in zip(lo, hi, strict=True)]
        rows = np.unique(np.concatenate(spans) if self.rows_K is None else self.rows_K[np.concatenate(spans)])
        groups = np.unique(np.searchsorted(self.group_starts, rows, side="right") - 1)
        table = self.read_groups(store, groups.tolist())
        offsets = np.concatenate(([0], np.cumsum(np.diff(self.group_starts)[groups])))
        local = np.concatenate(
            [
                rows[(rows >= self.group_starts[g]) & (rows < self.group_starts[g + 1])] - self.group_starts[g] + o
                for g, o in zip(groups, offsets[:-1], strict=True)
            ]
        )
        picked = table.take(pa.array(local))
        return list(zip(picked.column(0).to_pylist(), picked.column(1).to_pylist(), strict=True))


def _whole(store: Store, table: str, file: str) -> pa.BufferReader:
    """The whole of data file ``file`` of ``table`` (:meth:`Store.file_bytes`: on S3 one GET)."""
    body = store.file_bytes(table, file)
    if body is None:
        raise FileNotFoundError(f"{store.table_path(table)}/{file}")
    return pa.BufferReader(body)


def _rows_of(dataset: ds.Dataset, spec: IndexSpec) -> Iterator[pa.RecordBatch]:
    """Index rows of every row of some files of the indexed table, one sorted batch per read batch."""
    for batch in dataset.to_batches(columns=list(spec.columns), batch_size=READ_BATCH):
        if batch.num_rows:
            ids, values = spec.rows(batch)
            yield key_batch(ids, values, spec.schema)


__all__ = [
    "EVENT_INDEXES",
    "INDEX_TABLE",
    "INDEX_TABLES",
    "KEYS",
    "IndexSpec",
    "IndexView",
    "SampleIndex",
    "key_batch",
    "sample_keys",
]
