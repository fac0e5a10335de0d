"""Parquet files of a shard set, written with ``pyarrow.parquet`` and hashed as they are written.

A shard is written one row group at a time (:class:`ShardWriter`; row groups of whole groups:
:mod:`prl.shards.rowgroups`), zstd-compressed, with byte-stream-split floats (:data:`FLOAT_LEAVES`: the logprob,
KL, advantage and reward leaves), no dictionary on list columns (only on the repeated string scalars
:data:`DICTIONARY_COLUMNS`), and min/max/null-count statistics on the scalar columns a reader filters on
(:data:`SHARD_STATISTICS`). Arrow's schema is stored in the footer, so pyarrow reads a shard back as the very table
written and any Parquet reader (polars, DuckDB, Spark, datasets) reads it as ordinary Parquet.

The bytes go through :class:`HashingFile`, a small write-only file object that feeds each buffer pyarrow writes
to sha256 before it reaches the disk: a shard's size and digest are known when its writer closes, with no second
read of the file. The same table written with the same pyarrow gives the same bytes (:data:`WRITER` goes into
the set id).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from prl.schema import SHARD, float_leaves

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

WRITER = f"pyarrow {pa.__version__}"
"""The library that writes the Parquet bytes, and its version: part of a set id (same inputs and writer, same
bytes)."""

FLOAT_LEAVES = tuple(float_leaves(SHARD))
"""Parquet leaf columns (dotted paths) written with byte-stream-split encoding."""

SHARD_STATISTICS = ("staleness", "prompt_len", "reward", "advantage", "group_size")
"""Shard columns whose min/max/null count a shard's footer carries (cheap, and what readers filter on)."""

DICTIONARY_COLUMNS = ("group_id", "policy_version")
"""String columns that repeat within a shard: dictionary-encoded (Arrow falls back to PLAIN when it does not pay)."""

ZSTD_LEVEL = 1
"""zstd level of every page (Arrow's default for Parquet)."""


class HashingFile(io.RawIOBase):
    """A write-only binary file at ``path`` that keeps the sha256 and size of every byte written to it.

    Pass it to :func:`pyarrow.parquet.write_table` (or a :class:`pyarrow.parquet.ParquetWriter`) as ``where``;
    after writing, :attr:`size` and :meth:`hexdigest` describe the file's bytes. The file is not fsynced.
    """

    def __init__(self, path: str) -> None:
        super().__init__()
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._sha256 = hashlib.sha256()
        self.size = 0
        """Bytes written so far."""

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        self._sha256.update(view)  # releases the GIL for buffers over 2 KiB
        self._file.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        if not self.closed:
            self._file.flush()

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()  # flushes first
            finally:
                self._file.close()

    def hexdigest(self) -> str:
        """Hex sha256 of the bytes written so far."""
        return self._sha256.hexdigest()


def write_parquet(table: pa.Table, path: str, **settings: Any) -> tuple[int, str]:
    """Write ``table`` to ``path`` as one zstd row group (``settings`` go to :func:`pyarrow.parquet.write_table`);
    returns ``(bytes, hex sha256)`` of the file, hashed as written (not yet fsynced)."""
    with HashingFile(path) as fh:
        pq.write_table(
            table,
            fh,
            row_group_size=max(1, table.num_rows),
            compression="zstd",
            compression_level=ZSTD_LEVEL,
            **settings,
        )
        return fh.size, fh.hexdigest()


class ShardWriter:
    """One shard file at ``path`` (``SHARD`` schema), written a row group at a time and hashed as written.

    Each :meth:`write` adds its table (a run of the shard's rows) as one row group, so only that run is in memory;
    :meth:`close` finishes the file and returns ``(bytes, hex sha256)``. Use it as a context manager: a writer
    left by an error is closed (its file incomplete; the caller removes it)."""

    def __init__(self, path: str) -> None:
        self._file = HashingFile(path)
        try:
            self._writer = pq.ParquetWriter(
                self._file,
                SHARD,
                compression="zstd",
                compression_level=ZSTD_LEVEL,
                use_dictionary=list(DICTIONARY_COLUMNS),
                use_byte_stream_split=list(FLOAT_LEAVES),
                write_statistics=list(SHARD_STATISTICS),
            )
        except BaseException:
            self._file.close()
            raise

    def write(self, table: pa.Table) -> None:
        """Add ``table`` (``SHARD`` schema, at least one row) as one row group."""
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))

    def close(self) -> tuple[int, str]:
        """Write the footer and close the file; ``(bytes, hex sha256)`` of it (not yet fsynced)."""
        self._writer.close()
        self._file.close()
        return self._file.size, self._file.hexdigest()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._file.closed:
            return
        try:
            if exc_type is None:
                self._writer.close()
            else:  # the file is incomplete anyway: its footer is not worth a second error
                with contextlib.suppress(Exception):
                    self._writer.close()
        finally:
            self._file.close()


def write_shard(table: pa.Table, path: str) -> tuple[int, str]:
    """Write one shard (a table in the ``SHARD`` schema) to ``path`` as one row group; returns ``(bytes, hex
    sha256)``."""
    with ShardWriter(path) as writer:
        writer.write(table)
        return writer.close()


def write_ipc(table: pa.Table, path: str) -> tuple[int, str]:
    """Write ``table`` to ``path`` as an Arrow IPC file (zstd buffers), hashed as written (not yet fsynced):
    prl's own tables in ``OUT`` are never Parquet, so no Parquet reader of ``OUT`` picks them up."""
    with HashingFile(path) as fh:
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_file(pa.PythonFile(fh, mode="w"), table.schema, options=options) as writer:
            writer.write_table(table)
        return fh.size, fh.hexdigest()


def read_ipc(source: str | pa.Buffer, columns: list[str] | None = None) -> pa.Table:
    """An Arrow IPC file written by :func:`write_ipc` (a path or the file's bytes), ``columns`` only if given."""
    reader = pa.ipc.open_file(pa.memory_map(source) if isinstance(source, str) else pa.BufferReader(source))
    if columns is None:
        return reader.read_all()
    schema = pa.schema([reader.schema.field(c) for c in columns])
    return pa.Table.from_batches(
        [reader.get_batch(i).select(columns) for i in range(reader.num_record_batches)], schema
    )


def write_sample_ids(sample_ids: pa.Array, path: str) -> tuple[int, str]:
    """Write a set's sample ids (a string array, in the order given) to ``path`` as Arrow IPC; returns
    ``(bytes, hex sha256)``."""
    return write_ipc(pa.table({"sample_id": sample_ids}), path)


__all__ = [
    "DICTIONARY_COLUMNS",
    "FLOAT_LEAVES",
    "SHARD_STATISTICS",
    "WRITER",
    "HashingFile",
    "ShardWriter",
    "read_ipc",
    "write_ipc",
    "write_parquet",
    "write_sample_ids",
    "write_shard",
]
