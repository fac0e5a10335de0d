"""prl.parquet_writer: files that pyarrow and polars read back as exactly the table written."""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.schema import SHARD, float_leaves
from prl.shards import parquet_writer
from prl.shards.parquet_writer import CREATED_BY, _leaf, _page_rows, encode_levels, write_table

SCHEMA = pa.schema(
    [
        pa.field("s", pa.string(), nullable=False),
        pa.field("s_opt", pa.string()),
        pa.field("b", pa.bool_()),
        pa.field("i32", pa.int32(), nullable=False),
        pa.field("i64", pa.int64()),
        pa.field("f32", pa.float32()),
        pa.field("f64", pa.float64(), nullable=False),
        pa.field("l_i32", pa.list_(pa.int32()), nullable=False),
        pa.field("l_f32", pa.list_(pa.float32())),
        pa.field("l_b", pa.list_(pa.bool_()), nullable=False),
        pa.field("l_nn", pa.list_(pa.field("item", pa.float32(), nullable=False)), nullable=False),
        pa.field("l_s", pa.list_(pa.string())),
        pa.field("ll_i32", pa.list_(pa.list_(pa.int32()))),
        pa.field("ll_f32", pa.list_(pa.list_(pa.field("item", pa.float32(), nullable=False))), nullable=False),
    ]
)
SPLIT = ["f64", "l_f32.list.element", "l_nn.list.element", "ll_f32.list.element.list.element"]
STATS = ["i32", "i64", "f32", "f64"]

f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
f64 = st.floats(allow_nan=True, allow_infinity=True)
i32 = st.integers(-(2**31), 2**31 - 1)
text = st.text(max_size=5)


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


def lists(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(strategy, max_size=5)


row = st.fixed_dictionaries(
    {
        "s": text,
        "s_opt": maybe(text),
        "b": maybe(st.booleans()),
        "i32": i32,
        "i64": maybe(st.integers(-(2**63), 2**63 - 1)),
        "f32": maybe(f32),
        "f64": f64,
        "l_i32": lists(maybe(i32)),
        "l_f32": maybe(lists(maybe(f32))),
        "l_b": lists(maybe(st.booleans())),
        "l_nn": lists(f32),
        "l_s": maybe(lists(maybe(text))),
        "ll_i32": maybe(lists(maybe(lists(maybe(i32))))),
        "ll_f32": lists(lists(f32)),
    }
)


def canonical(value: object) -> object:
    """Rows as comparable values: floats by repr (so -0.0 ≠ 0.0 and NaN == NaN)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


def assert_reads_back(path: Path, table: pa.Table) -> None:
    back = pq.read_table(path)
    assert back.schema.equals(table.schema)
    assert canonical(back.to_pylist()) == canonical(table.to_pylist())
    assert canonical(pl.read_parquet(path).to_dicts()) == canonical(table.to_pylist())


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(row, max_size=12), page_slots=st.integers(1, 40))
def test_every_type_reads_back_exactly(tmp_path_factory, rows, page_slots):
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    path = tmp_path_factory.mktemp("w") / "t.parquet"
    size, sha256 = write_table(table, str(path), SPLIT, STATS, page_slots=page_slots)
    data = path.read_bytes()
    assert (size, sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert_reads_back(path, table)


def test_parquet_schema_and_encodings_match_arrows_writer(tmp_path):
    table = pa.Table.from_pylist(
        [{"s": "a", "i32": 1, "f64": 0.5, "l_i32": [1], "l_b": [True], "l_nn": [1.0], "ll_f32": [[1.0]]}],
        schema=SCHEMA,
    )
    ours, theirs = tmp_path / "ours.parquet", tmp_path / "theirs.parquet"
    write_table(table, str(ours), SPLIT, STATS)
    pq.write_table(table, theirs, compression="zstd", use_dictionary=False, use_byte_stream_split=SPLIT)
    ours_md, theirs_md = pq.read_metadata(ours), pq.read_metadata(theirs)
    assert pq.ParquetFile(ours).schema.equals(pq.ParquetFile(theirs).schema)
    assert ours_md.metadata == theirs_md.metadata  # the same ARROW:schema
    assert ours_md.created_by == CREATED_BY
    assert ours_md.format_version == "2.6"
    assert (ours_md.num_rows, ours_md.num_row_groups) == (1, 1)
    for i in range(ours_md.num_columns):
        ours_col, theirs_col = ours_md.row_group(0).column(i), theirs_md.row_group(0).column(i)
        assert ours_col.path_in_schema == theirs_col.path_in_schema
        assert ours_col.compression == "ZSTD"
        assert ours_col.num_values == theirs_col.num_values
        assert set(ours_col.encodings) == set(theirs_col.encodings) - {"RLE_DICTIONARY"}


def test_float_bits_are_kept_exactly(tmp_path):
    rng = np.random.default_rng(1)
    bits32 = rng.integers(0, 2**32, 500, dtype=np.uint64).astype(np.uint32)
    bits32[:4] = [0x7FC00001, 0xFFC12345, 0x80000000, 0x7F800000]  # NaN payloads, -0.0, inf
    bits64 = rng.integers(0, 2**63, 500, dtype=np.uint64) | np.uint64(1 << 63) * (np.arange(500) % 2 == 0)
    values32 = pa.array(bits32.view(np.float32))
    flat = pa.table({"plain": values32, "split": pa.array(bits64.view(np.float64))})
    lists = pa.table({"lists": pa.ListArray.from_arrays(pa.array([0, 200, 200, 500], pa.int32()), values32)})
    write_table(flat, str(tmp_path / "flat.parquet"), ["split"])
    write_table(lists, str(tmp_path / "lists.parquet"), ["lists.list.element"])
    back, back_lists = pq.read_table(tmp_path / "flat.parquet"), pq.read_table(tmp_path / "lists.parquet")
    assert np.array_equal(back["plain"].to_numpy().view(np.uint32), bits32)
    assert np.array_equal(back["split"].to_numpy().view(np.uint64), bits64)
    assert np.array_equal(back_lists["lists"].combine_chunks().values.to_numpy().view(np.uint32), bits32)
    assert back_lists["lists"].combine_chunks().offsets.to_pylist() == [0, 200, 200, 500]


def test_statistics_follow_parquets_float_rules(tmp_path):
    table = pa.table(
        {
            "f": pa.array([0.0, 2.5, float("nan"), -1.5, None], pa.float64()),
            "zero_low": pa.array([0.0, 1.0, 0.0, 2.0, 0.0], pa.float32()),
            "zero_high": pa.array([-0.0, -1.0, -0.0, -2.0, -0.0], pa.float32()),
            "nan": pa.array([float("nan")] * 5, pa.float32()),
            "i": pa.array([7, None, -3, None, 2**40], pa.int64()),
            "n": pa.array([None] * 5, pa.int32()),
        }
    )
    path = tmp_path / "stats.parquet"
    write_table(table, str(path), ["f"], table.column_names)
    stats = {c.path_in_schema: c.statistics for c in (pq.read_metadata(path).row_group(0).column(i) for i in range(6))}
    assert (stats["f"].min, stats["f"].max, stats["f"].null_count) == (-1.5, 2.5, 1)
    assert struct.pack("<f", stats["zero_low"].min) == struct.pack("<f", -0.0)  # a zero minimum is -0.0
    assert stats["zero_low"].max == 2.0
    assert struct.pack("<f", stats["zero_high"].max) == struct.pack("<f", 0.0)  # a zero maximum is +0.0
    assert stats["zero_high"].min == -2.0
    assert not stats["nan"].has_min_max
    assert (stats["i"].min, stats["i"].max, stats["i"].null_count) == (-3, 2**40, 2)
    assert (stats["n"].has_min_max, stats["n"].null_count) == (False, 5)


def test_a_shard_with_heads_reads_back_as_arrows_writer_writes_it(tmp_path):
    rng = np.random.default_rng(2)
    rows = []
    for i in range(40):
        p, c = int(rng.integers(1, 30)), int(rng.integers(0, 30))
        heads = None if i % 7 == 0 else rng.integers(0, 1000, (c, 3)).tolist()
        rows.append(
            {
                "sample_id": f"s{i}",
                "group_id": f"g{i // 4}",
                "policy_version": None if i % 5 == 0 else "v1",
                "staleness": None if i % 5 == 0 else int(rng.integers(0, 3)),
                "input_ids": rng.integers(0, 129280, p + c).tolist(),
                "prompt_len": p,
                "loss_mask": (rng.random(c) < 0.8).tolist(),
                "behavior_logprobs": (-rng.exponential(1, c)).astype(np.float32).tolist(),
                "ref_logprobs": None if i % 3 == 0 else (-rng.exponential(1, c)).tolist(),
                "kl": None if i % 3 == 0 else [None if j % 9 == 4 else 0.1 for j in range(c)],
                "token_advantages": rng.normal(0, 1, c).tolist(),
                "reward": float(i % 2),
                "advantage": float(i % 2) - 0.5,
                "group_size": 4,
                "topk_ids": heads,
                "topk_logprobs": None if heads is None else (-rng.exponential(1, (c, 3))).tolist(),
            }
        )
    table = pa.Table.from_pylist(rows, schema=SHARD)
    ours, theirs = tmp_path / "ours.parquet", tmp_path / "theirs.parquet"
    write_table(table, str(ours), float_leaves(SHARD), ["staleness", "reward"], page_slots=64)
    pq.write_table(table, theirs, compression="zstd", use_byte_stream_split=float_leaves(SHARD))
    assert pq.read_table(ours).equals(pq.read_table(theirs))
    assert pl.read_parquet(ours).equals(pl.read_parquet(theirs))
    assert_reads_back(ours, table)


def test_sliced_and_chunked_columns(tmp_path):
    table = pa.Table.from_pylist(
        [{"l": [i] * (i % 4) if i % 5 else None, "x": i if i % 3 else None} for i in range(60)],
        schema=pa.schema([pa.field("l", pa.list_(pa.int32())), pa.field("x", pa.int64())]),
    )
    for part, name in (
        (table.slice(7, 31), "slice"),
        (pa.concat_tables([table.slice(0, 9), table.slice(9, 0), table.slice(20, 13)]), "chunks"),
    ):
        path = tmp_path / f"{name}.parquet"
        write_table(part, str(path), page_slots=5)
        assert_reads_back(path, part)


def test_columns_of_nulls_and_arrays_without_buffers(tmp_path):
    types = [pa.float32(), pa.string(), pa.bool_(), pa.list_(pa.int32()), pa.list_(pa.list_(pa.float32()))]
    table = pa.table({f"c{i}": pa.nulls(4, t) for i, t in enumerate(types)})
    write_table(table, str(tmp_path / "nulls.parquet"), ["c0", "c4.list.element.list.element"])
    assert_reads_back(tmp_path / "nulls.parquet", table)
    bare = pa.table(
        {
            "f": pa.Array.from_buffers(pa.float64(), 0, [None, None]),
            "l": pa.Array.from_buffers(pa.list_(pa.int32()), 0, [None, None], children=[pa.array([], pa.int32())]),
            "l2": pa.Array.from_buffers(
                pa.list_(pa.int32()), 0, [None, pa.py_buffer(b"")], children=[pa.array([], pa.int32())]
            ),
            "s": pa.Array.from_buffers(pa.string(), 0, [None, None, pa.py_buffer(b"")]),
        }
    )
    write_table(bare, str(tmp_path / "bare.parquet"), ["f"], ["f"])
    assert_reads_back(tmp_path / "bare.parquet", bare)


def test_values_hidden_under_null_lists_are_not_written(tmp_path):
    # Arrow lets a null list keep a non-empty range of its child; those values belong to no row
    flat = pa.ListArray.from_arrays(
        pa.array([0, 2, 5, 6], pa.int32()), pa.array(range(6), pa.int32()), mask=pa.array([False, True, False])
    )
    inner = pa.ListArray.from_arrays(pa.array([0, 1, 3, 4, 6], pa.int32()), pa.array(range(6), pa.float32()))
    nested = pa.ListArray.from_arrays(pa.array([0, 1, 3, 4], pa.int32()), inner, mask=pa.array([False, True, False]))
    assert flat.to_pylist() == [[0, 1], None, [5]]
    assert nested.to_pylist() == [[[0.0]], None, [[4.0, 5.0]]]
    table = pa.table({"flat": flat, "nested": nested})
    for page_slots in (1, 100):
        write_table(
            table, str(tmp_path / "hidden.parquet"), ["nested.list.element.list.element"], page_slots=page_slots
        )
        assert_reads_back(tmp_path / "hidden.parquet", table)


def test_field_metadata_is_kept_per_table(tmp_path):
    plain = pa.table({"x": pa.array([1], pa.int32())})
    tagged = pa.Table.from_arrays(
        [pa.array([1], pa.int32())], schema=pa.schema([pa.field("x", pa.int32(), metadata={"k": "v"})])
    )
    for table, name in ((tagged, "tagged"), (plain, "plain"), (tagged, "tagged_again")):
        write_table(table, str(tmp_path / f"{name}.parquet"))
        assert (
            pq.read_table(tmp_path / f"{name}.parquet").schema.field("x").metadata == table.schema.field("x").metadata
        )


@pytest.mark.parametrize(
    ("field", "values", "level"),
    [
        (pa.field("x", pa.int32(), nullable=False), [1, None, 3], "x"),
        (pa.field("x", pa.list_(pa.int32()), nullable=False), [[1], None], "x"),
        (pa.field("x", pa.list_(pa.field("item", pa.int32(), nullable=False))), [[1, None]], "x.list.element"),
        (
            pa.field("x", pa.list_(pa.list_(pa.field("item", pa.float32(), nullable=False)))),
            [[[1.0], [None]]],
            "x.list.element.list.element",
        ),
    ],
)
def test_nulls_where_the_schema_forbids_them_are_an_error(tmp_path, field, values, level):
    table = pa.Table.from_arrays([pa.array(values, field.type)], schema=pa.schema([field]))
    with pytest.raises(ValueError, match=re.escape(f"column {level}: declared non-nullable but holds nulls")):
        write_table(table, str(tmp_path / "x.parquet"))


def test_a_null_hidden_under_a_null_list_is_not_an_error(tmp_path):
    items = pa.array([1, None, 3], pa.int32())
    column = pa.ListArray.from_arrays(pa.array([0, 1, 3], pa.int32()), items, mask=pa.array([False, True]))
    field = pa.field("x", pa.list_(pa.field("item", pa.int32(), nullable=False)))
    table = pa.Table.from_arrays([column.cast(field.type)], schema=pa.schema([field]))
    write_table(table, str(tmp_path / "x.parquet"), page_slots=1)
    assert pq.read_table(tmp_path / "x.parquet")["x"].to_pylist() == [[1], None]


def test_unknown_column_names_are_an_error(tmp_path):
    with pytest.raises(ValueError, match=re.escape("no such leaf column: f64.list.element, nope")):
        write_table(SCHEMA.empty_table(), str(tmp_path / "x.parquet"), ["f64.list.element"], ["nope"])


def test_bools_are_written_the_same_whatever_arrows_padding_bits_hold(tmp_path):
    clean = pa.Array.from_buffers(pa.bool_(), 11, [None, pa.py_buffer(bytes([0b00000101, 0b00000010]))])
    noisy = pa.Array.from_buffers(pa.bool_(), 11, [None, pa.py_buffer(bytes([0b00000101, 0b11111010]))])
    assert clean.to_pylist() == noisy.to_pylist()
    sliced = pa.array([True] * 3 + clean.to_pylist()).slice(3)  # starts inside a byte
    written = []
    for i, array in enumerate((clean, noisy, sliced)):
        write_table(pa.table({"b": array}), str(tmp_path / f"{i}.parquet"))
        written.append((tmp_path / f"{i}.parquet").read_bytes())
        assert pq.read_table(tmp_path / f"{i}.parquet")["b"].to_pylist() == clean.to_pylist()
    assert written[0] == written[1] == written[2]


def test_readers_that_stream_batches_across_page_boundaries(tmp_path):
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 9, 300)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    table = pa.table(
        {
            "ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 99, offsets[-1]), pa.int32())),
            "lp": pa.ListArray.from_arrays(pa.array(offsets), pa.array(-rng.random(offsets[-1]), pa.float32())),
            "x": pa.array(rng.random(300)),
        }
    )
    path = tmp_path / "pages.parquet"
    write_table(table, str(path), ["lp.list.element", "x"], page_slots=17)
    batches = list(pq.ParquetFile(path).iter_batches(batch_size=7))
    assert pa.Table.from_batches(batches).equals(table)
    assert pl.scan_parquet(path).slice(123, 45).collect().equals(pl.from_arrow(table.slice(123, 45)))


def test_empty_table_and_same_bytes_twice(tmp_path):
    empty = SCHEMA.empty_table()
    write_table(empty, str(tmp_path / "empty.parquet"), SPLIT, STATS)
    assert_reads_back(tmp_path / "empty.parquet", empty)
    table = pa.Table.from_pylist(
        [{"s": "x", "i32": 3, "f64": 1.0, "l_i32": [], "l_b": [], "l_nn": [], "ll_f32": []}], schema=SCHEMA
    )
    first = write_table(table, str(tmp_path / "a.parquet"), SPLIT, STATS)
    second = write_table(table, str(tmp_path / "b.parquet"), SPLIT, STATS)
    assert first == second
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


@pytest.mark.parametrize(
    ("schema", "split", "stats", "message"),
    [
        (pa.schema([("t", pa.timestamp("ms"))]), [], [], "column t: Arrow type timestamp[ms] is not written"),
        (pa.schema([("l", pa.large_list(pa.int32()))]), [], [], "column l: Arrow type large_list"),
        (pa.schema([("i", pa.int32())]), ["i"], [], "column i: byte-stream-split is for float columns, not int32"),
        (pa.schema([("l", pa.list_(pa.int32()))]), [], ["l.list.element"], "statistics are written for flat numeric"),
        (pa.schema([("s", pa.string())]), [], ["s"], "column s: statistics are written for flat numeric columns only"),
    ],
)
def test_unsupported_columns_are_a_clear_error(tmp_path, schema, split, stats, message):
    with pytest.raises(TypeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        write_table(schema.empty_table(), str(tmp_path / "x.parquet"), split, stats)


def test_pages_hold_whole_rows_by_first_slot():
    column = pa.array([[1, 2, 3], [4], [], [5, 6, 7, 8, 9], [1, 2]], pa.list_(pa.int32()))
    leaf = _leaf(pa.field("l", column.type), set(), set())
    # first slots at 0, 3, 4, 5, 10 → windows of 4 slots: 0, 0, 1, 1, 2
    assert _page_rows(column, leaf, 4) == [(0, 2), (2, 4), (4, 5)]
    assert _page_rows(column, leaf, 100) == [(0, 5)]
    nested = pa.array([[[1, 2], [3]], None, [[4, 5, 6]]], pa.list_(pa.list_(pa.int32())))
    # leaf slots per row 3, 1 (a null list), 3 → first slots 0, 3, 4 → windows of 3: 0, 1, 1
    assert _page_rows(nested, _leaf(pa.field("n", nested.type), set(), set()), 3) == [(0, 1), (1, 3)]
    assert _page_rows(column.slice(0, 0), leaf, 4) == [(0, 0)]


def test_a_page_over_parquets_size_limit_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_writer, "MAX_PAGE_BYTES", 1000)
    table = pa.table({"l": pa.array([list(range(300))], pa.list_(pa.int32()))})  # one row: 1,200 bytes of values
    with pytest.raises(ValueError, match=re.escape("column l.list.element: rows 0–1 of a chunk make a 1")):
        write_table(table, str(tmp_path / "x.parquet"))


def test_big_endian_hosts_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_writer.sys, "byteorder", "big")
    with pytest.raises(NotImplementedError, match="little-endian hosts only"):
        write_table(SCHEMA.empty_table(), str(tmp_path / "x.parquet"))


def test_page_slots_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="page_slots must be at least 1, not 0"):
        write_table(SCHEMA.empty_table(), str(tmp_path / "x.parquet"), page_slots=0)


# --- the two encoders, against independent decoders -------------------------------------------------------------


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def decode_levels(data: bytes, count: int, width: int) -> list[int]:
    """The RLE/bit-packed hybrid decoder of the Parquet spec, one value at a time."""
    out: list[int] = []
    at = 0
    while len(out) < count:
        header, at = read_varint(data, at)
        if header & 1:
            groups = header >> 1
            bits = int.from_bytes(data[at : at + groups * width], "little")
            at += groups * width
            out += [(bits >> (i * width)) & ((1 << width) - 1) for i in range(groups * 8)]
        else:
            value = int.from_bytes(data[at : at + (width + 7) // 8], "little")
            at += (width + 7) // 8
            out += [value] * (header >> 1)
    assert at == len(data)
    return out[:count]


@settings(max_examples=300, deadline=None)
@given(
    max_level=st.integers(1, 5),
    runs=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 300)), max_size=60),
)
def test_levels_decode_to_the_runs_given(max_level, runs):
    values = np.array([min(v, max_level) for v, _ in runs], np.uint8)
    lengths = np.array([n for _, n in runs], np.int64)
    slots = int(lengths.sum())
    encoded = encode_levels((values, lengths), slots, max_level)
    assert decode_levels(encoded, slots, max_level.bit_length()) == np.repeat(values, lengths).tolist()


def test_levels_that_alternate_are_bit_packed():
    for n in (8, 40):  # a few runs (plain Python) and many (numpy)
        values = np.tile(np.array([0, 1], np.uint8), n // 2)
        encoded = encode_levels((values, np.ones(n, np.int64)), n, 1)
        assert encoded == bytes([n // 8 << 1 | 1]) + bytes([0b10101010] * (n // 8))
    assert encode_levels((np.array([3], np.uint8), np.array([300])), 300, 3) == bytes([0xD8, 0x04, 3])
