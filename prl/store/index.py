"""The sample index: an exact ``sample_id → record_digest`` lookup whose cost follows the keys asked, not the
traces table.

The index is a Delta table, ``STORE/_index/traces_keys``, with one row per traces row: ``key`` (a 64-bit
blake2b of the sample ID), ``sample_id`` and ``record_digest``. A lookup reads only the ``key`` column (8 bytes
per stored sample, not the traces files), and reads IDs and digests only for the keys that matched (row groups
pruned by their key statistics), so almost all of the cost is the new keys themselves.

Never a false "present": the index is derived from committed traces rows only. Its commits carry a Delta
``txn`` (``prl.index.traces:<traces table id>`` → the traces version it covers); rows of a traces commit are
added after that commit, and a run that finds the index behind (a run killed between the two commits, an older
store) first adds the rows of the traces commits it is missing, found in the Delta log
(:func:`prl.store.changes.added_files`), or rebuilds it from the whole snapshot when the log no longer has them
or the traces table was re-created (its table id changed). Writers of ``traces`` hold the store's ``ingest``
lock, so index commits follow traces commits one by one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import CommitProperties, Transaction, WriterProperties, write_deltalake

from prl.errors import RetryableIOError
from prl.store.changes import added_files, files_dataset, snapshot_files
from prl.store.tables import Store, describe_error

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


def sample_keys(sample_ids: Iterable[str]) -> np.ndarray:
    """int64[N] keys of sample IDs (first 8 bytes of blake2b, big-endian, two's complement)."""
    digests = b"".join(hashlib.blake2b(s.encode(), digest_size=8).digest() for s in sample_ids)
    return np.frombuffer(digests, dtype=">i8").astype(np.int64)


def key_batch(sample_ids: pa.Array, digests: pa.Array) -> pa.RecordBatch:
    """Index rows for aligned ``sample_ids`` and ``record_digest`` string arrays, sorted by key."""
    keys = sample_keys(sample_ids.to_pylist())
    order = np.argsort(keys, kind="stable")
    return pa.RecordBatch.from_arrays([pa.array(keys[order]), sample_ids.take(order), digests.take(order)], schema=KEYS)


class SampleIndex:
    """Exact lookups of sample IDs in ``traces`` (see the module docstring). ``write=False`` (a dry run) keeps
    the rows of unindexed commits in memory instead of committing them."""

    def __init__(self, store: Store, *, write: bool = True) -> None:
        self.store = store
        self.write = write
        self.covered: int | None = None
        """The traces version the index (with :attr:`pending`) covers; None before :meth:`refresh`."""
        self.app_id: str | None = None
        self.pending: dict[str, str] = {}
        self._dataset: ds.Dataset | None = None

    # --- keeping up with traces --------------------------------------------------------------------------
    def refresh(self) -> None:
        """Bring the index up to the current traces version (a no-op when it already is)."""
        traces = self.store.open("traces")
        if traces is None:
            return
        version = traces.version()
        self.app_id = f"prl.index.traces:{traces.metadata().id}"
        index = self.store.open(INDEX_TABLE)
        covered = None if index is None else index.transaction_version(self.app_id)
        if self.covered is not None and self.covered > (covered if covered is not None else -1):
            covered = self.covered  # rows this dry run holds in memory
        if covered is not None and covered >= version:
            self.covered = covered
            self._open()
            return
        paths = None if covered is None else added_files(self.store, "traces", covered, version)
        rebuild = paths is None
        if paths is None:
            paths = snapshot_files(self.store, "traces", version)
        rows = _rows_of(files_dataset(self.store, "traces", paths))
        if self.write:
            self._commit(rows, version, overwrite=rebuild)
        else:
            if rebuild:
                self.pending.clear()
            for batch in rows:
                self.pending.update(zip(batch.column(1).to_pylist(), batch.column(2).to_pylist(), strict=True))
            self.covered = version
            if rebuild:
                self._dataset = None
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
                self._commit([key_batch(ids, digests)], version, overwrite=False)
                self._open()
            else:
                self.pending.update(rows)
                self.covered = version
            return
        self.refresh()

    def _commit(self, batches: Iterable[pa.RecordBatch], version: int, *, overwrite: bool) -> None:
        assert self.app_id is not None
        reader = pa.RecordBatchReader.from_batches(KEYS, iter(batches))
        props = CommitProperties(
            app_transactions=[Transaction(self.app_id, version)],
            custom_metadata={"prl.operation": "index", "prl.traces_version": str(version)},
            max_commit_retries=50,
        )
        try:
            write_deltalake(
                self.store.table_uri(INDEX_TABLE),
                reader,
                mode="overwrite" if overwrite else "append",
                storage_options=self.store.options or None,
                commit_properties=props,
                writer_properties=WriterProperties(compression="ZSTD", max_row_group_size=ROW_GROUP_ROWS),
            )
        except OSError as exc:
            raise RetryableIOError(
                f"writing the sample index of {self.store.uri} failed: {describe_error(exc)}"
            ) from exc
        self.covered = version

    def _open(self) -> None:
        table = self.store.open(INDEX_TABLE)
        if table is None:
            self._dataset = None
            return
        fs = pafs.SubTreeFileSystem(self.store.table_path(INDEX_TABLE), self.store.fs)
        self._dataset = table.to_pyarrow_dataset(filesystem=fs)

    # --- lookups -----------------------------------------------------------------------------------------
    def lookup(self, sample_ids: list[str]) -> dict[str, str]:
        """``sample_id → record_digest`` for those of ``sample_ids`` that are in traces (as of :attr:`covered`)."""
        found = {sid: self.pending[sid] for sid in sample_ids if sid in self.pending} if self.pending else {}
        if self._dataset is None or not sample_ids:
            return found
        keys = pa.array(sample_keys(sample_ids))
        hits = self._dataset.to_table(columns=["key"], filter=ds.field("key").isin(keys))
        if hits.num_rows == 0:
            return found
        candidates = pc.unique(hits.column("key").combine_chunks())
        rows = self._dataset.to_table(columns=["sample_id", "record_digest"], filter=ds.field("key").isin(candidates))
        wanted = set(sample_ids)
        for sid, digest in zip(rows.column(0).to_pylist(), rows.column(1).to_pylist(), strict=True):
            if sid in wanted:
                found[sid] = digest
        return found


def _rows_of(dataset: ds.Dataset) -> Iterator[pa.RecordBatch]:
    """Index rows of every row of some traces files, one sorted batch per read batch."""
    for batch in dataset.to_batches(columns=["sample_id", "record_digest"], batch_size=READ_BATCH):
        if batch.num_rows:
            yield key_batch(batch.column(0), batch.column(1))


__all__ = ["INDEX_TABLE", "KEYS", "SampleIndex", "key_batch", "sample_keys"]
