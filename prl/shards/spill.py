"""Token columns of a scan, spilled in scan order to an Arrow IPC file and gathered back shard by shard.

``prl build-shards`` decodes the store's token columns once, during its plan scan, and appends them here
(:meth:`ScanSpill.write`). Once the final order is known, each shard gathers its rows back (:meth:`ScanSpill.flat`
for lists of fixed-width values, :meth:`ScanSpill.gather` for anything else). Only the bytes of the rows gathered
are read (and of the touched batches' offsets and bitmaps), and nothing read stays mapped, so memory stays bounded
by the rows gathered, not by the file.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.typing import ArrayLike

_DROP = getattr(mmap, "MADV_DONTNEED", None)


@dataclass
class FlatList:
    """One list column of gathered rows, flattened.

    ``values_T`` holds every row's values back to back (nulls inside a list hold an unspecified value; see
    ``valid_T``); ``offsets_N1`` (int64, from 0) bounds row ``i`` at ``values_T[offsets_N1[i]:offsets_N1[i + 1]]``;
    ``valid_T`` (bool) is None when no value is null; ``row_valid_N`` (bool) is None when no row is null (a null
    row is empty). For a row-wise concatenation of columns, ``part_lengths`` holds each part's lengths (int64)
    and a null row of a part counts as empty (``row_valid_N`` is None).
    """

    values_T: np.ndarray
    offsets_N1: np.ndarray
    valid_T: np.ndarray | None = None
    row_valid_N: np.ndarray | None = None
    part_lengths: tuple[np.ndarray, ...] = ()

    def filled(self, dtype: type = np.float32) -> np.ndarray:
        """``values_T`` as ``dtype`` with NaN where a value is null (floats)."""
        values = self.values_T.astype(dtype, copy=False)  # type: ignore[var-annotated]
        return values if self.valid_T is None else np.where(self.valid_T, values, np.nan).astype(dtype)

    def to_arrow(self, value_type: pa.DataType) -> pa.ListArray:
        """The column as an Arrow list array of ``value_type`` (int32 offsets), nulls kept."""
        values = pa.array(self.values_T, type=value_type, mask=None if self.valid_T is None else ~self.valid_T)
        offsets = pa.array(self.offsets_N1.astype(np.int32))
        if self.row_valid_N is None:
            return pa.ListArray.from_arrays(offsets, values)
        return pa.ListArray.from_arrays(offsets, values, mask=pa.array(~self.row_valid_N))


def _runs(starts_R: np.ndarray, ends_R: np.ndarray) -> tuple[list[int], list[int]]:
    """Byte ranges ``[starts_R[i], ends_R[i])`` without the empty ones, merged where one ends where the next
    begins (rows that follow each other both in the file and in the result, as a group's samples usually do)."""
    keep = ends_R > starts_R
    starts_R, ends_R = starts_R[keep], ends_R[keep]
    if len(starts_R) < 2:
        return starts_R.tolist(), ends_R.tolist()
    first = np.flatnonzero(np.concatenate(([True], starts_R[1:] != ends_R[:-1])))
    last = np.concatenate((first[1:] - 1, [len(starts_R) - 1]))
    return starts_R[first].tolist(), ends_R[last].tolist()


def _read_ranges(fd: int, starts_R: ArrayLike, ends_R: ArrayLike) -> np.ndarray:
    """The file's byte ranges ``[starts_R[i], ends_R[i])`` back to back (uint8), read into place with one
    ``preadv`` (which runs without the GIL) per run of ranges that follow each other in the file."""
    starts, ends = _runs(np.asarray(starts_R, dtype=np.int64), np.asarray(ends_R, dtype=np.int64))
    out = np.empty(sum(ends) - sum(starts), dtype=np.uint8)
    view = memoryview(out)  # type: ignore[arg-type]
    pos = 0
    for start, end in zip(starts, ends, strict=True):
        while start < end:
            got = os.preadv(fd, [view[pos : pos + end - start]], start)
            if got <= 0:
                raise OSError(f"spill file ended at byte {start} of a row ending at byte {end}")
            pos += got
            start += got
    return out


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    """``length`` bits of an Arrow bitmap from bit ``offset``, as bool (LSB first)."""
    raw = np.frombuffer(buffer, dtype=np.uint8, count=(offset + length + 7) // 8)
    return np.unpackbits(raw, bitorder="little")[offset : offset + length].view(bool)


@dataclass
class _BatchColumn:
    """Where one list column of one spilled batch lies: its offsets, row validity, and its values (a byte position
    in the file for fixed-width values, or unpacked bools), with their validity."""

    offsets_R1: np.ndarray
    row_valid_R: np.ndarray | None
    byte_start: int
    bools_V: np.ndarray | None
    valid_V: np.ndarray | None


def _batch_column(array: pa.ListArray, mapped: pa.Buffer) -> _BatchColumn:
    """Where ``array`` (a list column of a batch read in place from the mapped file ``mapped``) lies in the file."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=len(array) + 1, offset=4 * array.offset)
    row_valid = None
    if array.null_count:
        row_valid = _bits(array.buffers()[0], array.offset, len(array))
    values = array.values
    size = values.type.bit_width
    valid = None
    if values.null_count:
        valid = _bits(values.buffers()[0], values.offset, len(values))
    if size == 1:
        return _BatchColumn(offsets, row_valid, 0, _bits(values.buffers()[1], values.offset, len(values)), valid)
    data = values.buffers()[1]
    if data is None or data.size == 0:  # no values: nothing will be read
        return _BatchColumn(offsets, row_valid, 0, None, valid)
    start = data.address - mapped.address
    if not 0 <= start <= start + data.size <= mapped.size:  # never read bytes that are not this column's
        raise RuntimeError("a spilled column was not read in place from its file; cannot locate its rows")
    return _BatchColumn(offsets, row_valid, start + values.offset * size // 8, None, valid)


class ScanSpill:
    """Rows of one table in scan order, in one Arrow IPC file, found again by their scan row numbers.

    Only the rows given to :meth:`write` are kept. Write every batch, :meth:`close`, then gather.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.sink: pa.OSFile | None = None
        self.writer: pa.ipc.RecordBatchFileWriter | None = None
        self.schema: pa.Schema | None = None
        self._rows: list[np.ndarray] = []
        self.rows_S = np.zeros(0, dtype=np.int64)
        """Scan row number of every spilled row (ascending)."""
        self.starts_B1 = np.zeros(1, dtype=np.int64)
        """Spill row where each written batch starts, and the total."""

    def write(self, batch: pa.RecordBatch, rows: np.ndarray) -> None:
        """Append ``batch`` whose rows have scan row numbers ``rows`` (ascending, after earlier writes)."""
        if batch.num_rows == 0:
            return
        if self.writer is None:
            self.schema = batch.schema
            self.sink = pa.OSFile(self.path, "wb")
            self.writer = pa.ipc.new_file(self.sink, batch.schema)
        self.writer.write_batch(batch)
        self._rows.append(np.asarray(rows, dtype=np.int64))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        if self._rows:
            self.rows_S = np.concatenate(self._rows)
            self.starts_B1 = np.concatenate(([0], np.cumsum([len(r) for r in self._rows])))
            self._rows = []

    def _locate(self, rows_N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(batch_N, index_N)``: the spilled batch holding each scan row and its index there."""
        assert self.schema is not None, "gather from an empty spill"
        spill_N = np.searchsorted(self.rows_S, rows_N)
        if len(rows_N) and not np.array_equal(self.rows_S[np.minimum(spill_N, len(self.rows_S) - 1)], rows_N):
            raise RuntimeError(f"rows missing from spill file {self.path}")
        batch_N = np.searchsorted(self.starts_B1, spill_N, side="right") - 1
        return batch_N, spill_N - self.starts_B1[batch_N]

    @contextmanager
    def _mapped(self) -> Iterator[tuple[pa.Buffer, pa.ipc.RecordBatchFileReader, int, Callable[[], None]]]:
        """The file, memory-mapped read-only, as a buffer with a reader over it, its descriptor, and a function
        that drops the mapped pages read so far (the kernel maps the pages around each one read, so they add up
        fast). On the way out the pages are dropped, and the mapping is closed unless the caller still holds a view
        of it (it closes when that goes)."""
        with open(self.path, "rb") as fh:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            buffer = reader = None
            try:
                buffer = pa.py_buffer(mapped)
                reader = pa.ipc.open_file(pa.BufferReader(buffer))
                yield buffer, reader, fh.fileno(), lambda: _DROP is not None and mapped.madvise(_DROP)  # type: ignore[func-returns-value, misc]
            finally:
                del reader, buffer
                if _DROP is not None:
                    mapped.madvise(_DROP)
                try:
                    mapped.close()
                except BufferError:  # a view still lives (an error on the way): the mapping closes when it goes
                    pass

    def flat(self, rows_N: np.ndarray, columns: Sequence[str | tuple[str, ...]]) -> dict[object, FlatList]:
        """Each of ``columns`` (lists of fixed-width values or bools) for the rows with scan row numbers ``rows_N``,
        in that order, keyed by the column; a tuple of columns of one value type is gathered as their row-wise
        concatenation (``part_lengths`` in order).

        Fixed-width values are read straight from the file into their place in the result, one ``pread`` per row
        and column (no per-value indices, no mapping of the values: a mapping would also bring in the pages around
        every row read, so that memory would grow towards the whole file). Only the touched batches' offsets and
        bitmaps are read through a mapping, and their pages are dropped before returning.
        """
        batch_N, index_N = self._locate(rows_N)
        touched = np.unique(batch_N).tolist()
        out: dict[object, FlatList] = {}
        with self._mapped() as (buffer, reader, fd, _):
            batches = {b: reader.get_batch(b) for b in touched}
            for spec in columns:
                names = (spec,) if isinstance(spec, str) else tuple(spec)
                out[spec] = self._flat_one(names, batches, batch_N, index_N, fd, buffer)
            del batches, buffer, reader  # every view of the mapping (the values are copies)
        return out

    def _flat_one(
        self,
        names: tuple[str, ...],
        batches: dict[int, pa.RecordBatch],
        batch_N: np.ndarray,
        index_N: np.ndarray,
        fd: int,
        mapped: pa.Buffer,
    ) -> FlatList:
        n = len(batch_N)
        assert self.schema is not None
        dtype = np.dtype(self.schema.field(names[0]).type.value_type.to_pandas_dtype())
        starts = np.zeros((n, len(names)), dtype=np.int64)  # value positions within each row's batch
        ends = np.zeros((n, len(names)), dtype=np.int64)
        byte_base = np.zeros((n, len(names)), dtype=np.int64)
        row_valid = np.ones(n, dtype=bool)
        columns: dict[tuple[int, int], _BatchColumn] = {}
        for b, batch in batches.items():
            sel = np.flatnonzero(batch_N == b)
            j = index_N[sel]
            for p, name in enumerate(names):
                col = _batch_column(batch.column(name), mapped)
                columns[(b, p)] = col
                starts[sel, p] = col.offsets_R1[j]
                ends[sel, p] = col.offsets_R1[j + 1]
                if col.row_valid_R is not None:
                    ok = col.row_valid_R[j]
                    ends[sel[~ok], p] = starts[sel[~ok], p]  # a null row is empty
                    if len(names) == 1:
                        row_valid[sel] = ok
                byte_base[sel, p] = col.byte_start
        lengths = ends - starts
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths.sum(axis=1), out=offsets[1:])

        def slices(arrays: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
            """The rows' value ranges of per-batch bool arrays (unpacked bits), back to back."""
            keys = [(b, p) for b in batch_N.tolist() for p in range(len(names))]  # per row and part, in order
            if not keys:
                return np.empty(0, dtype=bool)
            bounds = zip(starts.ravel().tolist(), ends.ravel().tolist(), strict=True)
            return np.concatenate([arrays[k][lo:hi] for k, (lo, hi) in zip(keys, bounds, strict=True)])

        if dtype == np.dtype(np.bool_):
            values = slices({k: c.bools_V for k, c in columns.items()})  # type: ignore[misc]
        else:  # the common case: straight from the file, no per-row Python besides the reads
            size = dtype.itemsize
            values = _read_ranges(fd, (byte_base + starts * size).ravel(), (byte_base + ends * size).ravel())
            values = values.view(dtype)
        valid = None
        if any(c.valid_V is not None for c in columns.values()):
            ones = {k: np.ones(int(c.offsets_R1[-1]), dtype=bool) for k, c in columns.items() if c.valid_V is None}
            valid = slices({k: c.valid_V if c.valid_V is not None else ones[k] for k, c in columns.items()})
        return FlatList(
            values,
            offsets,
            valid,
            None if row_valid.all() else row_valid,
            tuple(lengths[:, p] for p in range(len(names))) if len(names) > 1 else (),
        )

    def gather(self, rows_N: np.ndarray, columns: list[str]) -> pa.Table:
        """``columns`` of the rows with scan row numbers ``rows_N``, in that order (spill column types), through
        Arrow's ``take``: for columns :meth:`flat` does not cover (lists of lists)."""
        assert self.schema is not None, "gather from an empty spill"
        schema = pa.schema([self.schema.field(c) for c in columns])
        if len(rows_N) == 0:
            return schema.empty_table()
        batch_N, index_N = self._locate(rows_N)
        by_batch = np.argsort(batch_N, kind="stable")
        bounds = np.flatnonzero(np.diff(batch_N[by_batch])) + 1
        pieces = []
        with self._mapped() as (buffer, reader, _, drop_pages):
            for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(rows_N)])), strict=True):
                sel = by_batch[lo:hi]
                b = int(batch_N[sel[0]])
                pieces.append(reader.get_batch(b).select(columns).take(pa.array(index_N[sel])))
                drop_pages()  # the rows are copied: memory stays bounded by one batch
            del buffer, reader  # every view of the mapping (the pieces are copies)
        table = pa.Table.from_batches(pieces, schema=schema).combine_chunks()
        return table if len(pieces) == 1 else table.take(pa.array(np.argsort(by_batch)))
