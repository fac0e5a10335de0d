"""Token columns of a scan, spilled in scan order and gathered back shard by shard.

``prl build-shards`` decodes the store's token columns once, during its plan scan, and appends them here
(:meth:`ScanSpill.write`). Once the final order is known, each shard gathers its rows back (:meth:`ScanSpill.flat`
for lists of fixed-width values or bools, :meth:`ScanSpill.gather` for anything else).

A list column of fixed-width values (token ids, logprobs, masks) is spilled as raw files: its values back to back
(``<path>.<column>.values``; bools one byte each) and, once a null value has been seen, one validity byte per
value (``.valid``). Where each row's values start is kept in memory (8 bytes per row and column) until the rows
to gather are located (:meth:`ScanSpill.locate`; the build then keeps the places on disk and lets the spill's
row arrays go: :meth:`ScanSpill.forget_rows`), so a shard reads the bytes of its rows (and holes of a few KiB
between short ones), a window of rows per ``preadv`` (:func:`_read_into`): its cost and memory follow the rows
gathered, never the size of the spill. Other columns (the heads: lists of lists)
go to one Arrow IPC file (``<path>``), read through a mapping whose pages are dropped as the rows are copied.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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


_HOLE = 4096
"""Bytes: a hole of at most this many bytes between two runs of rows is read through (one read of both runs and the
hole) rather than skipped with another system call."""
_WINDOW = 1 << 18
"""Values: the most one staged read spans (besides its last run), so a window's bytes and the index arrays of its
gather stay a few MiB."""
_ALONE = 1024
"""Bytes: a run at least this long (or a quarter of a window, if less) is read on its own, straight into its place:
one system call costs less than gathering its values out of a staged read (on rows of 1,000 tokens, staging them
took build-shards from about 12.4 to 10.4 M tokens/s)."""


def _runs(starts_R: np.ndarray, ends_R: np.ndarray, dest_R: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte ranges ``[starts_R[i], ends_R[i])`` bound for ``dest_R[i]``, without the empty ones, merged where one
    ends where the next begins both in the file and in the result (rows that follow each other in both, as a
    group's samples usually do): ``(starts, ends, dests)`` of the merged runs (int64)."""
    keep = ends_R > starts_R
    starts_R, ends_R, dest_R = starts_R[keep], ends_R[keep], dest_R[keep]
    if len(starts_R) < 2:
        return starts_R, ends_R, dest_R
    follows = (starts_R[1:] == ends_R[:-1]) & (dest_R[1:] == dest_R[:-1] + (ends_R[:-1] - starts_R[:-1]))
    first = np.flatnonzero(np.concatenate(([True], ~follows)))
    last = np.concatenate((first[1:] - 1, [len(starts_R) - 1]))
    return starts_R[first], ends_R[last], dest_R[first]


def _windows(starts: np.ndarray, ends: np.ndarray, span: int) -> np.ndarray:
    """Where each read window opens, over runs sorted by ``starts``: at the first run, after a hole wider than
    :data:`_HOLE`, where the window would span more than ``span`` bytes, and at a run of :data:`_ALONE` bytes or
    more (or a quarter of ``span``, if less) and the run after it. Returns the index of each window's first run, and
    ``len(starts)`` last."""
    big = ends - starts >= min(_ALONE, span // 4)
    opens = np.ones(len(starts), dtype=bool)
    reach = np.maximum.accumulate(ends)  # the furthest byte the runs so far read (ranges may overlap)
    opens[1:] = (starts[1:] - reach[:-1] > _HOLE) | big[1:] | big[:-1]
    cluster = np.cumsum(opens) - 1
    base = starts[opens][cluster]  # where each run's cluster starts
    part = (starts - base) // span
    opens[1:] |= part[1:] != part[:-1]
    return np.concatenate((np.flatnonzero(opens), [len(starts)]))


def _read_exact(fd: int, view: memoryview, start: int, end: int) -> None:
    """The file's bytes ``[start, end)`` into ``view`` (as long), never short."""
    pos, stop = start, end
    while pos < stop:
        got = os.preadv(fd, [view[pos - start : stop - start]], pos)
        if got <= 0:
            raise OSError(f"spill file ended at byte {pos} of a row ending at byte {end}")
        pos += got


def _read_into(
    fd: int, out: np.ndarray, starts_R: ArrayLike, ends_R: ArrayLike, dest_R: ArrayLike, unit: int = 1
) -> None:
    """Read the file's byte ranges ``[starts_R[i], ends_R[i])`` into ``out`` (uint8) at byte ``dest_R[i]``.

    Merged runs (:func:`_runs`) are taken in file order a window at a time (:func:`_windows`): a window of one
    run is read straight into its place with one ``preadv`` (which runs without the GIL); a window of many short
    runs (a shard of short samples, a group of eight apart from the next) is read whole with one ``preadv`` and
    its runs copied out by one gather over ``unit``-byte values (every start, end and destination a multiple of
    ``unit``; any other range makes it 1), so the system calls follow the bytes read, not the rows. Nothing beyond
    a window's span (its runs and the holes of at most :data:`_HOLE` between them) is read."""
    starts, ends, dests = _runs(
        np.asarray(starts_R, dtype=np.int64), np.asarray(ends_R, dtype=np.int64), np.asarray(dest_R, dtype=np.int64)
    )
    if unit > 1 and np.any((starts | ends | dests) % unit):
        unit = 1
    if len(starts) > 1:
        order = np.argsort(starts, kind="stable")
        starts, ends, dests = starts[order], ends[order], dests[order]
    view = memoryview(out)  # type: ignore[arg-type]
    windows = _windows(starts, ends, _WINDOW * unit).tolist() if len(starts) else [0]
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[unit]
    target = out.view(dtype)
    for lo, hi in pairwise(windows):
        if hi - lo == 1:
            start, end, dest = int(starts[lo]), int(ends[lo]), int(dests[lo])
            _read_exact(fd, view[dest : dest + end - start], start, end)
            continue
        first, last = int(starts[lo]), int(ends[lo:hi].max())
        staged = np.empty(last - first, dtype=np.uint8)
        _read_exact(fd, memoryview(staged), first, last)  # type: ignore[arg-type]
        values = staged.view(dtype)
        lengths = (ends[lo:hi] - starts[lo:hi]) // unit
        # copied a slice of runs at a time, each of at most a window's values besides its last run, so that the
        # index arrays stay bounded even where the ranges repeat (one row asked for many times)
        slices = np.flatnonzero(np.diff(np.cumsum(lengths) // _WINDOW)) + 1
        for a, b in pairwise([0, *slices.tolist(), hi - lo]):
            n = lengths[a:b]
            within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
            source = np.repeat((starts[lo + a : lo + b] - first) // unit, n) + within
            target[np.repeat(dests[lo + a : lo + b] // unit, n) + within] = values[source]


def is_flat(field: pa.Field) -> bool:
    """Whether a spilled column is a list of fixed-width values or bools (spilled raw, read by :meth:`ScanSpill.flat`)."""
    t = field.type
    return pa.types.is_list(t) and (pa.types.is_boolean(t.value_type) or pa.types.is_primitive(t.value_type))


class _RawColumn:
    """One flat list column spilled raw: values back to back, validity bytes once a null is seen, row starts in
    memory."""

    def __init__(self, path: str, value_type: pa.DataType) -> None:
        self.values_path, self.valid_path = f"{path}.values", f"{path}.valid"
        self.value_type = value_type
        self.dtype = np.dtype(np.uint8) if pa.types.is_boolean(value_type) else np.dtype(value_type.to_pandas_dtype())
        self._values: BinaryIO | None = open(self.values_path, "wb")  # noqa: SIM115 (closed by close())
        self._valid: BinaryIO | None = None
        self._lengths: list[np.ndarray] = []
        """Each batch's row lengths (int32: a list column's offsets are int32)."""
        self._row_valid: list[np.ndarray | int] = []
        """Each batch's row validity, or its row count when no row is null."""
        self.count = 0
        """Values written so far."""
        self.starts_S1 = np.zeros(1, dtype=np.int64)
        """Value index where each spilled row starts, and the total (after :meth:`close`)."""
        self.row_valid_S: np.ndarray | None = None
        """Whether each spilled row is not null (None when none is)."""
        self.has_valid = False

    def write(self, column: pa.ListArray) -> None:
        values = column.flatten()  # the values of the rows that are not null, back to back
        if pa.types.is_boolean(self.value_type):
            data = pc.fill_null(values, False).to_numpy(zero_copy_only=False).view(np.uint8)
        else:
            buffer = values.buffers()[1]
            data = (
                np.frombuffer(buffer, self.dtype, len(values), values.offset * self.dtype.itemsize)
                if len(values)
                else np.zeros(0, self.dtype)
            )
        if values.null_count and self._valid is None:
            self._valid = open(self.valid_path, "wb")  # noqa: SIM115
            self._valid.write(np.ones(self.count, dtype=np.uint8).tobytes())
            self.has_valid = True
        if self._valid is not None:
            valid = (
                values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else np.ones(len(values), bool)
            )
            self._valid.write(valid.view(np.uint8).tobytes())
        assert self._values is not None, "write after close"
        self._values.write(np.ascontiguousarray(data).view(np.uint8).data)
        self.count += len(values)
        self._lengths.append(pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False))
        self._row_valid.append(column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else len(column))

    def close(self) -> None:
        """Close the files (the column then travels to other processes as its paths and row starts)."""
        if self._values is not None:
            self._values.close()
            self._values = None
        if self._valid is not None:
            self._valid.close()
            self._valid = None
        if self._lengths:
            self.starts_S1 = np.zeros(sum(len(n) for n in self._lengths) + 1, dtype=np.int64)
            np.cumsum(np.concatenate(self._lengths), dtype=np.int64, out=self.starts_S1[1:])
            self._lengths = []
            if any(isinstance(v, np.ndarray) for v in self._row_valid):
                self.row_valid_S = np.concatenate(
                    [v if isinstance(v, np.ndarray) else np.ones(v, dtype=bool) for v in self._row_valid]
                )
            self._row_valid = []


class ScanSpill:
    """Rows of one table in scan order, found again by their scan row numbers: flat list columns in raw files,
    the others in one Arrow IPC file (see the module docstring).

    Only the rows given to :meth:`write` are kept. Write every batch, :meth:`close`, then gather.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.sink: pa.OSFile | None = None
        self.writer: pa.ipc.RecordBatchFileWriter | None = None
        self.schema: pa.Schema | None = None
        self.raw: dict[str, _RawColumn] = {}
        self._forgotten = False  # forget_rows() was called: rows are read only through locate()
        self._rows: list[np.ndarray] = []
        self._nested: list[str] = []
        self.rows_S = np.zeros(0, dtype=np.int64)
        """Scan row number of every spilled row (ascending)."""
        self.starts_B1 = np.zeros(1, dtype=np.int64)
        """Spill row where each batch of the IPC file starts, and the total."""

    def write(self, batch: pa.RecordBatch, rows: np.ndarray) -> None:
        """Append ``batch`` whose rows have scan row numbers ``rows`` (ascending, after earlier writes)."""
        if batch.num_rows == 0:
            return
        if self.schema is None:
            self.schema = batch.schema
            for i, field in enumerate(batch.schema):
                if is_flat(field):
                    self.raw[field.name] = _RawColumn(f"{self.path}.{i}", field.type.value_type)
                else:
                    self._nested.append(field.name)
            if self._nested:
                self.sink = pa.OSFile(self.path, "wb")
                self.writer = pa.ipc.new_file(self.sink, pa.schema([batch.schema.field(n) for n in self._nested]))
        for name, column in self.raw.items():
            column.write(batch.column(name))
        if self.writer is not None:
            self.writer.write_batch(batch.select(self._nested))
        self._rows.append(np.asarray(rows, dtype=np.int64))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        for column in self.raw.values():
            column.close()
        if self._rows:
            self.rows_S = np.concatenate(self._rows)
            self.starts_B1 = np.concatenate(([0], np.cumsum([len(r) for r in self._rows])))
            self._rows = []

    def _spill_rows(self, rows_N: np.ndarray) -> np.ndarray:
        """The spill row (index into :attr:`rows_S`) of each scan row."""
        assert self.schema is not None, "gather from an empty spill"
        if self._forgotten:
            raise RuntimeError(f"the rows of spill file {self.path} were forgotten: read them through locate()")
        spill_N = np.searchsorted(self.rows_S, rows_N)
        if len(rows_N) and not np.array_equal(self.rows_S[np.minimum(spill_N, len(self.rows_S) - 1)], rows_N):
            raise RuntimeError(f"rows missing from spill file {self.path}")
        return spill_N

    @contextmanager
    def _mapped(self) -> Iterator[tuple[pa.ipc.RecordBatchFileReader, Callable[[], None]]]:
        """The IPC file, memory-mapped read-only, with a reader over it and a function that drops the mapped
        pages read so far (the kernel maps the pages around each one read, so they add up fast). On the way out
        the pages are dropped, and the mapping is closed unless the caller still holds a view of it (it closes
        when that goes)."""
        with open(self.path, "rb") as fh:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            buffer = reader = None
            try:
                buffer = pa.py_buffer(mapped)
                reader = pa.ipc.open_file(pa.BufferReader(buffer))
                yield reader, lambda: _DROP is not None and mapped.madvise(_DROP)  # type: ignore[func-returns-value, misc]
            finally:
                del reader, buffer
                if _DROP is not None:
                    mapped.madvise(_DROP)
                try:
                    mapped.close()
                except BufferError:  # a view still lives (an error on the way): the mapping closes when it goes
                    pass

    def locate(self, rows_N: np.ndarray, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """Where the rows with scan row numbers ``rows_N`` sit in the spill, in that order: ``spill_row`` (int64)
        and, per flat column of ``columns``, ``<column>:start`` and ``<column>:len`` (int64: the row's first value
        and value count) and, when a spilled row of the column is null, ``<column>:valid`` (bool). What
        :meth:`flat_at` and :meth:`take_at` read, so that once the rows to gather are located the spill's own row
        arrays can go (:meth:`forget_rows`)."""
        spill_N = self._spill_rows(rows_N)
        out = {"spill_row": spill_N}
        for name in columns:
            column = self.raw[name]
            out[f"{name}:start"] = start = column.starts_S1[spill_N]
            out[f"{name}:len"] = column.starts_S1[spill_N + 1] - start
            if column.row_valid_S is not None:
                out[f"{name}:valid"] = column.row_valid_S[spill_N]
        return out

    def forget_rows(self) -> None:
        """Drop the per-row arrays kept in memory (scan row numbers, row starts, row validity): from here on
        rows are read only through what :meth:`locate` returned."""
        self.rows_S = np.zeros(0, dtype=np.int64)
        for column in self.raw.values():
            column.starts_S1 = np.zeros(1, dtype=np.int64)
            column.row_valid_S = None
        self._forgotten = True

    def flat(self, rows_N: np.ndarray, columns: Sequence[str | tuple[str, ...]]) -> dict[object, FlatList]:
        """Each of ``columns`` (lists of fixed-width values or bools) for the rows with scan row numbers ``rows_N``,
        in that order, keyed by the column; a tuple of columns of one value type is gathered as their row-wise
        concatenation (``part_lengths`` in order). The values are read straight from the spill files into their
        place in the result (:func:`_read_into`); nothing else is read."""
        names = [n for spec in columns for n in ((spec,) if isinstance(spec, str) else spec)]
        return self.flat_at(self.locate(rows_N, list(dict.fromkeys(names))), columns)

    def flat_at(
        self, located: Mapping[str, np.ndarray], columns: Sequence[str | tuple[str, ...]]
    ) -> dict[object, FlatList]:
        """:meth:`flat` of the rows ``located`` (:meth:`locate`, or a slice of each of its arrays)."""
        out: dict[object, FlatList] = {}
        for spec in columns:
            names = (spec,) if isinstance(spec, str) else tuple(spec)
            out[spec] = self._flat_one([self.raw[name] for name in names], names, located)
        return out

    def _flat_one(self, parts: list[_RawColumn], names: tuple[str, ...], located: Mapping[str, np.ndarray]) -> FlatList:
        starts = [np.asarray(located[f"{n}:start"], dtype=np.int64) for n in names]
        lengths = [np.asarray(located[f"{n}:len"], dtype=np.int64) for n in names]
        offsets = np.zeros(len(starts[0]) + 1, dtype=np.int64)
        np.cumsum(np.sum(lengths, axis=0), out=offsets[1:])
        dtype = parts[0].dtype
        size = dtype.itemsize
        values = np.empty(int(offsets[-1]), dtype=dtype)
        valid = np.ones(len(values), dtype=bool) if any(p.has_valid for p in parts) else None
        dest = offsets[:-1].copy()
        for part, start, length in zip(parts, starts, lengths, strict=True):
            with _opened(part.values_path) as fd:
                _read_into(fd, values.view(np.uint8), start * size, (start + length) * size, dest * size, size)
            if valid is not None and part.has_valid:
                with _opened(part.valid_path) as fd:
                    _read_into(fd, valid.view(np.uint8), start, start + length, dest)
            dest += length
        row_valid = None
        if len(parts) == 1 and f"{names[0]}:valid" in located:
            row_valid = np.asarray(located[f"{names[0]}:valid"], dtype=bool)
            row_valid = None if row_valid.all() else row_valid
        return FlatList(
            values.view(bool) if dtype == np.uint8 and pa.types.is_boolean(parts[0].value_type) else values,
            offsets,
            valid,
            row_valid,
            tuple(lengths) if len(parts) > 1 else (),
        )

    def gather(self, rows_N: np.ndarray, columns: list[str]) -> pa.Table:
        """``columns`` of the rows with scan row numbers ``rows_N``, in that order (spill column types): flat
        columns through :meth:`flat`, the others through Arrow's ``take`` from the IPC file."""
        assert self.schema is not None, "gather from an empty spill"
        schema = pa.schema([self.schema.field(c) for c in columns])
        if len(rows_N) == 0:
            return schema.empty_table()
        located = self.locate(rows_N, [c for c in columns if c in self.raw])
        nested = [c for c in columns if c not in self.raw]
        taken = self.take_at(located["spill_row"], nested) if nested else None
        flat = self.flat_at(located, [c for c in columns if c in self.raw])
        arrays = [
            flat[c].to_arrow(self.raw[c].value_type) if c in self.raw else taken.column(c)  # type: ignore[union-attr]
            for c in columns
        ]
        return pa.Table.from_arrays(arrays, schema=schema)

    def take_at(self, spill_N: np.ndarray, columns: list[str]) -> pa.Table:
        """``columns`` (of the IPC file) of the spill rows ``spill_N`` (:meth:`locate`'s ``spill_row``), in that
        order."""
        assert self.schema is not None, "gather from an empty spill"
        schema = pa.schema([self.schema.field(c) for c in columns])
        if len(spill_N) == 0:
            return schema.empty_table()
        spill_N = np.asarray(spill_N, dtype=np.int64)
        batch_N = np.searchsorted(self.starts_B1, spill_N, side="right") - 1
        index_N = spill_N - self.starts_B1[batch_N]
        by_batch = np.argsort(batch_N, kind="stable")
        bounds = np.flatnonzero(np.diff(batch_N[by_batch])) + 1
        pieces = []
        with self._mapped() as (reader, drop_pages):
            for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(spill_N)])), strict=True):
                sel = by_batch[lo:hi]
                b = int(batch_N[sel[0]])
                pieces.append(reader.get_batch(b).select(columns).take(pa.array(index_N[sel])))
                drop_pages()  # the rows are copied: memory stays bounded by one batch
            del reader  # every view of the mapping (the pieces are copies)
        table = pa.Table.from_batches(pieces, schema=schema).combine_chunks()
        return table if len(pieces) == 1 else table.take(pa.array(np.argsort(by_batch)))


@contextmanager
def _opened(path: str) -> Iterator[int]:
    """A read-only descriptor of ``path``, closed on the way out."""
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)
