"""Parquet encoding of shard tables with numpy: one row group, zstd data pages, float leaves byte-stream-split.

Arrow's own writer spends much of a shard's encoding time on repetition and definition levels, which it builds
and run-length encodes one value at a time. A shard's list columns rarely hold a null, so their levels are a few
runs per innermost list (repetition: the list's level at its first value, the deepest level for the rest;
definition: the maximum level). This module derives those runs from list offsets and validity bitmaps alone,
per row for ``input_ids`` and per position for the top-k heads. Only lists that hold null values (or null lists
that hide values) take the general path: the levels of every value slot are built with numpy, one pass per
nesting level (Dremel's record shredding), then run-length or bit-pack encoded, whichever is smaller.

Only what Arrow's writer itself emits is used: data page v1, PLAIN values, RLE/bit-packed levels,
BYTE_STREAM_SPLIT for the float leaves named, zstd, the 3-level ``LIST`` layout, min/max statistics for the
flat columns named, and the Arrow schema stored under ``ARROW:schema`` exactly as Arrow stores it. pyarrow
therefore reads a file back as the very table written (same schema, same values), and any Parquet reader
(polars, DuckDB, Spark) reads it as ordinary Parquet.

Supported Arrow types: ``bool``, ``int32``, ``int64``, ``float32``, ``float64``, ``string``, and lists of them
(nested to any depth), each nullable or not. Pages hold whole rows and about :data:`PAGE_SLOTS` leaf slots.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from prl import __version__
from prl.shards import thrift_compact as thrift

PAGE_SLOTS = 1 << 20
"""Leaf slots (values and nulls) per data page: about 4 MiB of float32 values, so a reader holds a few MiB per
column at a time. A page holds whole rows. (Smaller pages cost more numpy and zstd calls for no gain here: no
page index is written, so a reader cannot skip pages anyway.)"""

ZSTD_LEVEL = 1
"""zstd level of every page (Arrow's default for Parquet)."""

CREATED_BY = f"prl version {__version__}"

_MAGIC = b"PAR1"

# parquet.thrift enums
_BOOLEAN, _INT32, _INT64, _FLOAT, _DOUBLE, _BYTE_ARRAY = 0, 1, 2, 4, 5, 6
_REQUIRED, _OPTIONAL, _REPEATED = 0, 1, 2
_PLAIN, _RLE, _BYTE_STREAM_SPLIT = 0, 3, 9
_ZSTD = 6
_CONVERTED_UTF8, _CONVERTED_LIST = 0, 3
_DATA_PAGE = 0

_PHYSICAL: dict[pa.DataType, tuple[int, np.dtype | None]] = {
    pa.bool_(): (_BOOLEAN, None),
    pa.int32(): (_INT32, np.dtype("<i4")),
    pa.int64(): (_INT64, np.dtype("<i8")),
    pa.float32(): (_FLOAT, np.dtype("<f4")),
    pa.float64(): (_DOUBLE, np.dtype("<f8")),
    pa.string(): (_BYTE_ARRAY, None),
}

# ---------------------------------------------------------------------------------------------------------------
# schema


@dataclass(frozen=True)
class _Leaf:
    """One Parquet leaf column of an Arrow field.

    ``nullable`` has one entry per nesting level, outermost first (the field, then each list's items);
    ``max_rep`` counts the lists, ``max_def`` the nullable levels plus the lists."""

    path: tuple[str, ...]
    value_type: pa.DataType
    nullable: tuple[bool, ...]
    byte_stream_split: bool
    statistics: bool

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def max_rep(self) -> int:
        return len(self.nullable) - 1

    @property
    def max_def(self) -> int:
        return sum(self.nullable) + self.max_rep


def _leaf(field: pa.Field, byte_stream_split: set[str], statistics: set[str]) -> _Leaf:
    path, nullable, typ = [field.name], [field.nullable], field.type
    while pa.types.is_list(typ):
        path += ["list", "element"]
        nullable.append(typ.value_field.nullable)
        typ = typ.value_type
    dotted = ".".join(path)
    if typ not in _PHYSICAL:
        raise TypeError(f"column {dotted}: Arrow type {typ} is not written by prl.parquet_writer")
    if dotted in byte_stream_split and not pa.types.is_floating(typ):
        raise TypeError(f"column {dotted}: byte-stream-split is for float columns, not {typ}")
    if dotted in statistics and (len(path) > 1 or _PHYSICAL[typ][1] is None):
        raise TypeError(f"column {dotted}: statistics are written for flat numeric columns only, not {field.type}")
    return _Leaf(tuple(path), typ, tuple(nullable), dotted in byte_stream_split, dotted in statistics)


def _schema_elements(schema: pa.Schema) -> list[thrift.Struct]:
    """The flattened Parquet schema (lists as 3-level ``LIST`` groups named ``list``/``element``)."""
    elements: list[thrift.Struct] = [
        [(3, thrift.I32, _REQUIRED), (4, thrift.BINARY, "schema"), (5, thrift.I32, len(schema))]
    ]

    def walk(name: str, typ: pa.DataType, nullable: bool) -> None:
        repetition = _OPTIONAL if nullable else _REQUIRED
        if pa.types.is_list(typ):
            list_logical: thrift.Struct = [(3, thrift.STRUCT, [])]
            elements.append(
                [
                    (3, thrift.I32, repetition),
                    (4, thrift.BINARY, name),
                    (5, thrift.I32, 1),
                    (6, thrift.I32, _CONVERTED_LIST),
                    (10, thrift.STRUCT, list_logical),
                ]
            )
            elements.append([(3, thrift.I32, _REPEATED), (4, thrift.BINARY, "list"), (5, thrift.I32, 1)])
            walk("element", typ.value_type, typ.value_field.nullable)
            return
        element: thrift.Struct = [
            (1, thrift.I32, _PHYSICAL[typ][0]),
            (3, thrift.I32, repetition),
            (4, thrift.BINARY, name),
        ]
        if typ == pa.string():
            string_logical: thrift.Struct = [(1, thrift.STRUCT, [])]
            element += [(6, thrift.I32, _CONVERTED_UTF8), (10, thrift.STRUCT, string_logical)]
        elements.append(element)

    for field in schema:
        walk(field.name, field.type, field.nullable)
    return elements


def _arrow_schema_value(schema: pa.Schema) -> bytes:
    """The ``ARROW:schema`` metadata value, as Arrow's writer stores it: the IPC schema message, base64."""
    return base64.b64encode(schema.serialize().to_pybytes())


# ---------------------------------------------------------------------------------------------------------------
# record shredding: leaf slots → repetition and definition levels


Levels = tuple[np.ndarray, np.ndarray]
"""Levels as runs: ``(values_R uint8, lengths_R int64)``, every length ≥ 1."""


@dataclass
class _Shredded:
    """One page of one leaf: its slot count, level runs (None when the leaf has no such levels) and the
    non-null leaf values in slot order."""

    slots: int
    rep: Levels | None
    dfn: Levels | None
    values: pa.Array


def _runs(values: np.ndarray, lengths: np.ndarray) -> Levels:
    """Join neighbouring runs of equal value and drop empty ones."""
    keep = lengths > 0
    values, lengths = values[keep], lengths[keep]
    if len(values) == 0:
        return values.astype(np.uint8), lengths.astype(np.int64)
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[starts].astype(np.uint8), np.add.reduceat(lengths.astype(np.int64), starts)


def _levels_of(levels: np.ndarray) -> Levels:
    return _runs(levels, np.ones(len(levels), np.int64))


def _valid(arr: pa.Array) -> np.ndarray | None:
    """Validity of ``arr``'s slots (bool_N), or None when none is null."""
    return None if arr.null_count == 0 else np.asarray(arr.is_valid())


def _offsets(arr: pa.ListArray) -> np.ndarray:
    """``arr``'s offsets (int32, length N + 1) into ``arr.values``, the slice's own offset applied."""
    buffer = arr.buffers()[1]
    if buffer is None or len(arr) == 0:  # no lists, or only nulls: Arrow may leave the offsets out
        return np.zeros(len(arr) + 1, np.int32)
    return np.frombuffer(buffer, np.int32, len(arr) + 1, arr.offset * 4)


def _shred(arr: pa.Array, leaf: _Leaf) -> _Shredded:
    """Levels and values of the rows in ``arr`` (the whole field, or a slice of its rows)."""
    if leaf.max_rep == 0:
        return _shred_flat(arr, leaf)
    return _shred_lists(arr, leaf) or _shred_nested(arr, leaf)


def _shred_flat(arr: pa.Array, leaf: _Leaf) -> _Shredded:
    n = len(arr)
    valid = _valid(arr)
    if not leaf.nullable[0]:
        if valid is not None:
            raise ValueError(f"column {leaf.dotted}: declared non-nullable but holds nulls")
        return _Shredded(n, None, None, arr)
    if valid is None:
        return _Shredded(n, None, _runs(np.ones(1, np.uint8), np.array([n])), arr)
    return _Shredded(n, None, _levels_of(valid.astype(np.uint8)), arr.filter(pa.array(valid)))


@dataclass
class _Slots:
    """Slots after expanding some list levels: per slot its repetition and definition level so far (uint8),
    whether it is still defined (``live``: no null or empty list above it), and the index of its element in
    ``node`` (the array of the next level, cut to the rows' share). ``gaps``: a null list above holds values."""

    rep: np.ndarray
    dfn: np.ndarray
    live: np.ndarray
    at: np.ndarray
    node: pa.Array
    gaps: bool = False

    def defined(self, leaf: _Leaf, depth: int) -> np.ndarray | None:
        """Apply the validity of ``node`` (nesting level ``depth`` of ``leaf``): a null element ends its slot;
        returns the validity. A null where the level is not nullable is an error, as in Arrow's writer."""
        valid = _valid(self.node)
        if valid is None:
            self.dfn[self.live] += leaf.nullable[depth]
            return None
        if not leaf.nullable[depth]:
            if not valid[self.at[self.live]].all():
                level = ".".join(leaf.path[: 1 + 2 * depth])
                raise ValueError(f"column {level}: declared non-nullable but holds nulls")
            return valid
        self.live[self.live] = valid[self.at[self.live]]
        self.dfn[self.live] += 1
        return valid

    def lengths(self, offsets: np.ndarray) -> np.ndarray:
        """Each live slot's list length (0 for the others), from ``node``'s offsets."""
        return np.where(self.live, offsets[np.where(self.live, self.at + 1, self.at)] - offsets[self.at], 0)


def _descend(arr: pa.Array, leaf: _Leaf, lists: int) -> _Slots:
    """Expand the outer ``lists`` list levels of ``arr`` into one slot per element of the next level (or per
    null or empty list above it): Dremel's record shredding, one numpy pass per level."""
    n = len(arr)
    slots = _Slots(np.zeros(n, np.uint8), np.zeros(n, np.uint8), np.ones(n, bool), np.arange(n, dtype=np.int64), arr)
    for depth in range(lists):
        valid = slots.defined(leaf, depth)
        offsets = _offsets(slots.node)
        if valid is not None:
            slots.gaps |= bool(np.diff(offsets)[~valid].any())
        lengths = slots.lengths(offsets)
        expands = lengths > 0
        counts = np.where(expands, lengths, 1)
        parent = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        ordinal = np.arange(len(parent), dtype=np.int64) - (np.cumsum(counts) - counts)[parent]
        rep = slots.rep[parent]
        rep[ordinal > 0] = depth + 1
        # the rows' children lie in [offsets[0], offsets[-1]): go on with just those (a page's share)
        low, high = int(offsets[0]), int(offsets[-1])
        slots = _Slots(
            rep,
            slots.dfn[parent] + expands[parent].astype(np.uint8),
            expands[parent],
            np.where(expands[parent], offsets[slots.at][parent] + ordinal - low, 0),
            slots.node.values.slice(low, high - low),
            slots.gaps,
        )
    return slots


def _shred_lists(arr: pa.Array, leaf: _Leaf) -> _Shredded | None:
    """Levels as runs, computed per innermost list rather than per value: a run of the list's first slot and a
    run of the rest, one definition run per list. None (take :func:`_shred_nested`) when a value is null or a
    null list holds values, since then the values are not one contiguous range."""
    slots = _descend(arr, leaf, leaf.max_rep - 1)
    valid = slots.defined(leaf, leaf.max_rep - 1)
    offsets = _offsets(slots.node)
    if slots.gaps or (valid is not None and np.diff(offsets)[~valid].any()):
        return None
    items = slots.node.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if items.null_count:
        return None
    lengths = slots.lengths(offsets).astype(np.int64)
    expands = lengths > 0
    count = np.where(expands, lengths, 1)
    dfn = np.where(expands, leaf.max_def, slots.dfn).astype(np.uint8)
    rep_values = np.empty(2 * len(count), np.uint8)
    rep_values[0::2] = slots.rep
    rep_values[1::2] = leaf.max_rep
    rep_lengths = np.ones(2 * len(count), np.int64)
    rep_lengths[1::2] = count - 1
    return _Shredded(int(count.sum()), _runs(rep_values, rep_lengths), _runs(dfn, count), items)


def _shred_nested(arr: pa.Array, leaf: _Leaf) -> _Shredded:
    """Levels of every value slot (any depth, nulls anywhere), then the non-null values picked out."""
    slots = _descend(arr, leaf, leaf.max_rep)
    slots.defined(leaf, leaf.max_rep)
    picked = slots.at[slots.live]
    if len(picked) and picked[-1] - picked[0] + 1 == len(picked):  # increasing, so one contiguous range
        values = slots.node.slice(int(picked[0]), len(picked))
    else:
        values = slots.node.take(pa.array(picked)) if len(picked) else slots.node.slice(0, 0)
    return _Shredded(len(slots.rep), _levels_of(slots.rep), _levels_of(slots.dfn), values)


# ---------------------------------------------------------------------------------------------------------------
# encodings


def _varints(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LEB128 bytes of every value of ``x`` (uint64_R): ``(bytes_B uint8, byte counts_R)``, values back to back."""
    x = x.astype(np.uint64)
    count = np.ones(len(x), np.int64)
    for k in range(1, 10):
        count += x >= np.uint64(1 << (7 * k))
    start = np.cumsum(count) - count
    out = np.empty(int(count.sum()), np.uint8)
    for k in range(int(count.max(initial=0))):
        has = count > k
        more = (count[has] > k + 1).astype(np.uint8) << 7
        out[start[has] + k] = ((x[has] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8) | more
    return out, count


def encode_levels(levels: Levels, slots: int, max_level: int) -> bytes:
    """RLE/bit-packed hybrid bytes of ``slots`` levels given as runs (lengths ≥ 1): one RLE run per run, or a
    single bit-packed run when that is smaller (levels that change often)."""
    values, lengths = levels
    width = max_level.bit_length()
    rle: bytes | None = None
    if len(values) <= _FEW_RUNS:  # plain Python beats numpy's per-call cost here
        rle = b"".join(thrift.varint(int(n) << 1) + bytes((int(v),)) for v, n in zip(values, lengths, strict=True))
        rle_size = len(rle)
    else:
        heads, head_counts = _varints(lengths << 1)
        rle_size = len(heads) + len(values)
    groups = -(-slots // 8)
    packed_head = thrift.varint(groups << 1 | 1)
    if len(packed_head) + groups * width < rle_size:
        padded = np.zeros(groups * 8, np.uint8)
        padded[:slots] = np.repeat(values, lengths)
        bits = (padded[:, None] >> np.arange(width, dtype=np.uint8)) & 1
        return packed_head + np.packbits(bits.reshape(-1), bitorder="little").tobytes()
    if rle is not None:
        return rle
    out = np.empty(rle_size, np.uint8)
    value_at = np.cumsum(head_counts + 1) - 1
    is_head = np.ones(rle_size, bool)
    is_head[value_at] = False
    out[is_head] = heads
    out[value_at] = values
    return out.tobytes()


_FEW_RUNS = 16
"""Up to this many runs, RLE level bytes are built in plain Python."""


def _fixed_width(values: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The values of a fixed-width array without nulls as bytes (uint8, zero-copy)."""
    buffer = values.buffers()[1]
    if buffer is None or len(values) == 0:  # Arrow may leave the buffer out
        return np.zeros(0, np.uint8)
    return np.frombuffer(buffer, dtype, len(values), values.offset * dtype.itemsize).view(np.uint8)


def _bits(values: pa.BooleanArray) -> np.ndarray:
    """PLAIN bytes of non-null bools: bit-packed LSB first, which is Arrow's own layout; copied as bytes when the
    array starts on a byte (padding bits cleared), unpacked and packed again otherwise."""
    n = len(values)
    if values.offset % 8 or values.buffers()[1] is None:
        return np.packbits(values.to_numpy(zero_copy_only=False), bitorder="little")
    start = values.offset // 8
    out = np.frombuffer(values.buffers()[1], np.uint8)[start : start + -(-n // 8)].copy()
    if n % 8:
        out[-1] &= (1 << (n % 8)) - 1
    return out


def _page_body(shredded: _Shredded, leaf: _Leaf) -> np.ndarray:
    """Uncompressed v1 data page body (uint8): length-prefixed repetition and definition levels, then the
    values, PLAIN or byte-stream-split; the values are copied once, straight into place."""
    prefix = b""
    for levels, max_level in ((shredded.rep, leaf.max_rep), (shredded.dfn, leaf.max_def)):
        if max_level:
            assert levels is not None
            encoded = encode_levels(levels, shredded.slots, max_level)
            prefix += len(encoded).to_bytes(4, "little") + encoded
    physical, dtype = _PHYSICAL[leaf.value_type]
    if dtype is None:
        values = _variable_values(shredded.values, physical)
    else:
        values = _fixed_width(shredded.values, dtype)
        if not prefix and not leaf.byte_stream_split:
            return values
    body = np.empty(len(prefix) + len(values), np.uint8)
    body[: len(prefix)] = np.frombuffer(prefix, np.uint8)
    if dtype is not None and leaf.byte_stream_split:
        _byte_stream_split(values, dtype.itemsize, body[len(prefix) :])
    else:
        body[len(prefix) :] = values
    return body


def _byte_stream_split(raw: np.ndarray, width: int, out: np.ndarray) -> None:
    """BYTE_STREAM_SPLIT ``raw`` (uint8, ``width``-byte little-endian values) into ``out``: byte k of every value,
    for k = 0 … width − 1, one plane after the other. Shifting whole words and narrowing them is about twice as
    fast as numpy's strided byte copy."""
    words = raw.view(np.uint32 if width == 4 else np.uint64)
    planes = out.reshape(width, -1)
    shifted = np.empty_like(words)
    for k in range(width):
        np.right_shift(words, 8 * k, out=shifted)
        np.copyto(planes[k], shifted, casting="unsafe")


def _variable_values(values: pa.Array, physical: int) -> np.ndarray:
    """PLAIN bytes (uint8) of a non-null bool or string array: bits LSB first, or 4-byte length + bytes each."""
    if physical == _BOOLEAN:
        return _bits(values)
    if len(values) == 0:  # Arrow may leave the buffers out
        return np.zeros(0, np.uint8)
    offsets = np.frombuffer(values.buffers()[1], np.int32, len(values) + 1, values.offset * 4)
    data = np.frombuffer(values.buffers()[2] or b"", np.uint8)[offsets[0] : offsets[-1]]
    out = np.empty(4 * len(values) + len(data), np.uint8)
    heads = ((offsets[:-1] - offsets[0]) + 4 * np.arange(len(values)))[:, None] + np.arange(4)
    is_data = np.ones(len(out), bool)
    is_data[heads.reshape(-1)] = False
    out[heads.reshape(-1)] = np.diff(offsets).astype("<u4").view(np.uint8)
    out[is_data] = data
    return out


def _statistics(column: pa.ChunkedArray, leaf: _Leaf) -> thrift.Struct:
    """Min, max and null count of a flat column, with Parquet's float rules (NaN ignored, zero as -0.0/+0.0)."""
    _, dtype = _PHYSICAL[leaf.value_type]
    assert dtype is not None
    values = column.drop_null().to_numpy(zero_copy_only=False).astype(dtype)
    stats: thrift.Struct = [(3, thrift.I64, column.null_count)]
    if values.dtype.kind == "f":
        values = values[~np.isnan(values)]
    if len(values):
        low, high = values.min(), values.max()
        if values.dtype.kind == "f":
            low = -0.0 if low == 0 else low
            high = 0.0 if high == 0 else high
        stats += [
            (5, thrift.BINARY, np.array([high], dtype).tobytes()),
            (6, thrift.BINARY, np.array([low], dtype).tobytes()),
            (7, thrift.BOOL, True),
            (8, thrift.BOOL, True),
        ]
    return stats


def _page_rows(column: pa.Array, leaf: _Leaf, page_slots: int) -> list[tuple[int, int]]:
    """Row ranges ``[start, end)`` of the pages: a row goes to the page in whose ``page_slots`` window its first
    leaf slot falls (whole rows per page; an empty column is one empty page)."""
    n = len(column)
    cost = np.ones(n, np.int64)
    if leaf.max_rep:
        lo, hi = np.arange(n), np.arange(1, n + 1)
        node: pa.Array = column
        for _ in range(leaf.max_rep):
            offsets = _offsets(node).astype(np.int64)
            lo, hi = offsets[lo], offsets[hi]
            node = node.values
        cost = np.maximum(hi - lo, 1)
    page = (np.cumsum(cost) - cost) // page_slots
    cuts = np.flatnonzero(np.diff(page)) + 1
    bounds = [0, *cuts.tolist(), n]
    return list(itertools.pairwise(bounds)) if n else [(0, 0)]


# ---------------------------------------------------------------------------------------------------------------
# file


MAX_PAGE_BYTES = (1 << 31) - 1
"""Parquet's page header holds sizes as int32."""


def _column_chunk(
    column: pa.ChunkedArray, leaf: _Leaf, file_offset: int, codec: pa.Codec, page_slots: int
) -> tuple[list[bytes | pa.Buffer], thrift.Struct, int]:
    """Pages of one column chunk starting at ``file_offset``: ``(bytes to write, ColumnChunk struct, uncompressed
    size in bytes)``. Each Arrow chunk is paged on its own (pages never span chunks), so nothing is concatenated."""
    chunks: list[bytes | pa.Buffer] = []
    uncompressed = compressed = slots = 0
    encoding = _BYTE_STREAM_SPLIT if leaf.byte_stream_split else _PLAIN
    arrays = [a for a in column.chunks if len(a)] or [pa.array([], column.type)]
    pages = [(array, start, end) for array in arrays for start, end in _page_rows(array, leaf, page_slots)]
    for array, start, end in pages:
        shredded = _shred(array.slice(start, end - start), leaf)
        body = _page_body(shredded, leaf)
        if len(body) > MAX_PAGE_BYTES:
            raise ValueError(
                f"column {leaf.dotted}: rows {start}–{end} of a chunk make a {len(body)}-byte page, over Parquet's "
                f"{MAX_PAGE_BYTES}-byte limit"
            )
        data = codec.compress(body, asbytes=False)
        header = thrift.encode(
            [
                (1, thrift.I32, _DATA_PAGE),
                (2, thrift.I32, len(body)),
                (3, thrift.I32, data.size),
                (
                    5,
                    thrift.STRUCT,
                    [
                        (1, thrift.I32, shredded.slots),
                        (2, thrift.I32, encoding),
                        (3, thrift.I32, _RLE),
                        (4, thrift.I32, _RLE),
                    ],
                ),
            ]
        )
        chunks += [header, data]
        uncompressed += len(header) + len(body)
        compressed += len(header) + data.size
        slots += shredded.slots
    meta: thrift.Struct = [
        (1, thrift.I32, _PHYSICAL[leaf.value_type][0]),
        (2, thrift.LIST, (thrift.I32, sorted({encoding, _RLE}))),
        (3, thrift.LIST, (thrift.BINARY, list(leaf.path))),
        (4, thrift.I32, _ZSTD),
        (5, thrift.I64, slots),
        (6, thrift.I64, uncompressed),
        (7, thrift.I64, compressed),
        (9, thrift.I64, file_offset),
        (12, thrift.STRUCT, _statistics(column, leaf) if leaf.statistics else None),
    ]
    return chunks, [(2, thrift.I64, 0), (3, thrift.STRUCT, meta)], uncompressed


def write_table(
    table: pa.Table,
    path: str,
    byte_stream_split: Iterable[str] = (),
    statistics: Iterable[str] = (),
    page_slots: int = PAGE_SLOTS,
) -> tuple[int, str]:
    """Write ``table`` to ``path`` as one row group (not fsynced); returns the file's size and hex sha256,
    hashed from the bytes as they are written.

    ``byte_stream_split``: dotted leaf paths (``name.list.element``) of float columns to write
    byte-stream-split (the others PLAIN); ``statistics``: flat numeric columns whose min, max and null count
    the footer carries; ``page_slots``: leaf slots per data page (see :data:`PAGE_SLOTS`)."""
    if page_slots < 1:
        raise ValueError(f"page_slots must be at least 1, not {page_slots}")
    if sys.byteorder != "little":  # values are copied from Arrow's native-order buffers; Parquet's are little-endian
        raise NotImplementedError("prl.parquet_writer runs on little-endian hosts only")
    split, stats = set(byte_stream_split), set(statistics)
    leaves = [_leaf(field, split, stats) for field in table.schema]
    unknown = (split | stats) - {leaf.dotted for leaf in leaves}
    if unknown:
        raise ValueError(f"no such leaf column: {', '.join(sorted(unknown))}")
    codec = pa.Codec("zstd", ZSTD_LEVEL)
    digest = hashlib.sha256()
    offset = 0
    column_chunks: list[thrift.Struct] = []
    uncompressed_total = 0

    with open(path, "wb") as fh:

        def emit(data: bytes | pa.Buffer) -> None:
            nonlocal offset
            view = memoryview(data)
            digest.update(view)
            fh.write(view)
            offset += view.nbytes

        emit(_MAGIC)
        first = offset
        for column, leaf in zip(table.columns, leaves, strict=True):
            chunks, chunk_struct, uncompressed = _column_chunk(column, leaf, offset, codec, page_slots)
            for data in chunks:
                emit(data)
            uncompressed_total += uncompressed
            column_chunks.append(chunk_struct)
        footer = thrift.encode(
            [
                (1, thrift.I32, 2),
                (2, thrift.LIST, (thrift.STRUCT, _schema_elements(table.schema))),
                (3, thrift.I64, table.num_rows),
                (
                    4,
                    thrift.LIST,
                    (
                        thrift.STRUCT,
                        [
                            [
                                (1, thrift.LIST, (thrift.STRUCT, column_chunks)),
                                (2, thrift.I64, uncompressed_total),
                                (3, thrift.I64, table.num_rows),
                                (5, thrift.I64, first),
                                (6, thrift.I64, offset - first),
                                (7, thrift.I16, 0),
                            ]
                        ],
                    ),
                ),
                (
                    5,
                    thrift.LIST,
                    (
                        thrift.STRUCT,
                        [[(1, thrift.BINARY, "ARROW:schema"), (2, thrift.BINARY, _arrow_schema_value(table.schema))]],
                    ),
                ),
                (6, thrift.BINARY, CREATED_BY),
                (7, thrift.LIST, (thrift.STRUCT, [[(1, thrift.STRUCT, [])] for _ in leaves])),
            ]
        )
        emit(footer)
        emit(len(footer).to_bytes(4, "little"))
        emit(_MAGIC)
    return offset, digest.hexdigest()
