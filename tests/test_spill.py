"""ScanSpill: rows written in scan order come back, in any order, exactly as written."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.shards import spill as spill_module
from prl.shards.spill import FlatList, ScanSpill

SCHEMA = pa.schema(
    [
        pa.field("ids", pa.list_(pa.int32())),
        pa.field("more", pa.list_(pa.int32())),
        pa.field("lp", pa.list_(pa.float32())),
        pa.field("mask", pa.list_(pa.bool_())),
        pa.field("heads", pa.list_(pa.list_(pa.int32()))),
    ]
)

ints = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6)
floats = st.lists(st.one_of(st.none(), st.floats(width=32, allow_nan=False)), max_size=6)
masks = st.one_of(st.none(), st.lists(st.one_of(st.none(), st.booleans()), max_size=6))
heads = st.one_of(st.none(), st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=3))
row = st.fixed_dictionaries({"ids": ints, "more": ints, "lp": floats, "mask": masks, "heads": heads})


def _read_ranges(fd, starts_R, ends_R):
    """The file's byte ranges ``[starts_R[i], ends_R[i])`` back to back (uint8), through ``_read_into``."""
    starts = np.asarray(starts_R, dtype=np.int64)
    lengths = np.maximum(np.asarray(ends_R, dtype=np.int64) - starts, 0)
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    spill_module._read_into(fd, out, starts, starts + lengths, np.cumsum(lengths) - lengths)
    return out


def as_list(flat: FlatList, i: int) -> list | None:
    if flat.row_valid_N is not None and not flat.row_valid_N[i]:
        return None
    lo, hi = int(flat.offsets_N1[i]), int(flat.offsets_N1[i + 1])
    values = flat.values_T[lo:hi].tolist()
    if flat.valid_T is not None:
        values = [v if ok else None for v, ok in zip(values, flat.valid_T[lo:hi].tolist(), strict=True)]
    return values


def spill_of(tmp_path, rows: list[dict], cuts: list[int], kept: list[bool]) -> tuple[ScanSpill, list[int]]:
    """Spill ``rows`` cut into batches at ``cuts``, keeping only the rows marked in ``kept``; returns the spill
    and the scan row numbers kept."""
    spill = ScanSpill(str(tmp_path / "spill.arrow"))
    bounds = sorted({0, len(rows), *[c % (len(rows) + 1) for c in cuts]})
    kept_rows = []
    for lo, hi in itertools.pairwise(bounds):
        batch = pa.RecordBatch.from_pylist(rows[lo:hi], schema=SCHEMA)
        keep = np.array(kept[lo:hi])
        numbers = np.arange(lo, hi)[keep]
        spill.write(batch.filter(pa.array(keep)), numbers)
        kept_rows += numbers.tolist()
    spill.close()
    return spill, kept_rows


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(row, min_size=1, max_size=25),
    cuts=st.lists(st.integers(0, 30), max_size=4),
    data=st.data(),
)
def test_flat_and_gather_return_the_rows_written(tmp_path_factory, rows, cuts, data):
    kept = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)).filter(any))
    spill, kept_rows = spill_of(tmp_path_factory.mktemp("spill"), rows, cuts, kept)
    wanted = data.draw(st.lists(st.sampled_from(kept_rows), max_size=30))
    rows_N = np.array(wanted, dtype=np.int64)

    flat = spill.flat(rows_N, [("ids", "more"), "ids", "lp", "mask"])
    for i, r in enumerate(wanted):
        assert as_list(flat[("ids", "more")], i) == rows[r]["ids"] + rows[r]["more"]
        assert as_list(flat["ids"], i) == rows[r]["ids"]
        assert as_list(flat["lp"], i) == rows[r]["lp"]
        assert as_list(flat["mask"], i) == rows[r]["mask"]
    pair = flat[("ids", "more")]
    assert [p.tolist() for p in pair.part_lengths] == [
        [len(rows[r]["ids"]) for r in wanted],
        [len(rows[r]["more"]) for r in wanted],
    ]
    assert pair.values_T.dtype == np.int32 and flat["lp"].values_T.dtype == np.float32
    assert flat["mask"].values_T.dtype == np.bool_
    assert flat["lp"].to_arrow(pa.float32()).to_pylist() == [rows[r]["lp"] for r in wanted]
    assert flat["mask"].to_arrow(pa.bool_()).to_pylist() == [rows[r]["mask"] for r in wanted]
    assert spill.gather(rows_N, ["heads", "ids"]).to_pylist() == [
        {"heads": rows[r]["heads"], "ids": rows[r]["ids"]} for r in wanted
    ]


def test_flat_fills_nulls_with_nan_and_reports_validity(tmp_path):
    rows = [
        {"ids": [1], "more": [], "lp": [-0.5, None, -2.0], "mask": None, "heads": None},
        {"ids": [2, 3], "more": [4], "lp": [], "mask": [True, None], "heads": [[1]]},
    ]
    spill, _ = spill_of(tmp_path, rows, [1], [True, True])
    flat = spill.flat(np.array([1, 0]), ["lp", "mask", ("ids", "more")])
    assert flat["lp"].offsets_N1.tolist() == [0, 0, 3]
    np.testing.assert_array_equal(flat["lp"].filled(), np.array([-0.5, np.nan, -2.0], dtype=np.float32))
    assert flat["lp"].valid_T.tolist() == [True, False, True]
    assert flat["mask"].row_valid_N.tolist() == [True, False]
    assert flat["mask"].values_T.tolist() == [True, False] and flat["mask"].valid_T.tolist() == [True, False]
    assert flat[("ids", "more")].values_T.tolist() == [2, 3, 4, 1]
    assert flat[("ids", "more")].offsets_N1.tolist() == [0, 3, 4]


def test_flat_of_no_rows_is_empty(tmp_path):
    rows = [{"ids": [1], "more": [2], "lp": [-1.0], "mask": None, "heads": None}]
    spill, _ = spill_of(tmp_path, rows, [], [True])
    flat = spill.flat(np.zeros(0, dtype=np.int64), [("ids", "more"), "lp"])
    assert flat["lp"].values_T.tolist() == [] and flat["lp"].offsets_N1.tolist() == [0]
    assert flat[("ids", "more")].values_T.dtype == np.int32
    assert spill.gather(np.zeros(0, dtype=np.int64), ["heads"]).num_rows == 0


def test_a_row_never_spilled_is_an_error(tmp_path):
    rows = [{"ids": [1], "more": [], "lp": [], "mask": None, "heads": None}] * 3
    spill, _ = spill_of(tmp_path, rows, [], [True, False, True])
    with pytest.raises(RuntimeError, match="rows missing from spill file"):
        spill.flat(np.array([1]), ["ids"])
    with pytest.raises(RuntimeError, match="rows missing from spill file"):
        spill.gather(np.array([0, 1]), ["heads"])


def test_a_damaged_spill_file_is_an_error(tmp_path):
    rows = [{"ids": list(range(50)), "more": [], "lp": [-1.0] * 50, "mask": None, "heads": [[1, 2]]}] * 4
    spill, kept = spill_of(tmp_path, rows, [2], [True] * 4)
    ids = spill.raw["ids"].values_path
    assert os.path.getsize(ids) == 4 * 50 * 4  # int32 values back to back, nothing else
    with open(ids, "r+b") as fh:
        fh.truncate(4 * 50 * 4 - 8)  # the last row's last two values are gone: never returned short
    assert spill.flat(np.array(kept[:3]), ["ids"])["ids"].values_T.tolist() == list(range(50)) * 3
    with pytest.raises(OSError, match=r"spill file ended at byte 792 of a row ending at byte 800"):
        spill.flat(np.array(kept[3:]), ["ids"])
    size = os.path.getsize(spill.path)
    with open(spill.path, "r+b") as fh:
        fh.truncate(size - 64)  # the footer that indexes the IPC file's batches is gone
    with pytest.raises(pa.ArrowInvalid):
        spill.gather(np.array(kept), ["heads"])
    with open(ids, "rb") as fh:  # a row range past the end of the file is never returned short
        with pytest.raises(OSError, match=r"spill file ended at byte \d+ of a row ending at byte \d+"):
            _read_ranges(fh.fileno(), [0, 792], [8, 800])
        assert _read_ranges(fh.fileno(), [0, 4], [4, 8]).tobytes() == fh.read(8)


def test_flat_columns_are_raw_files_and_the_rest_one_ipc_file(tmp_path):
    """Token lists spill as values back to back (bools one byte each), validity bytes only once a null is seen
    (ones for the values before it); the heads go to the IPC file, which holds nothing else."""
    rows = [
        {"ids": [7, 8], "more": [9], "lp": [-1.0], "mask": [True, False], "heads": [[1]]},
        {"ids": [], "more": [], "lp": [None, -2.0], "mask": None, "heads": None},
    ]
    spill, _ = spill_of(tmp_path, rows, [1], [True, True])
    raw = spill.raw
    assert sorted(raw) == ["ids", "lp", "mask", "more"]
    assert np.fromfile(raw["ids"].values_path, np.int32).tolist() == [7, 8]
    assert np.fromfile(raw["mask"].values_path, np.uint8).tolist() == [1, 0]
    assert raw["ids"].starts_S1.tolist() == [0, 2, 2] and raw["mask"].row_valid_S.tolist() == [True, False]
    assert not os.path.exists(raw["ids"].valid_path) and raw["ids"].row_valid_S is None
    assert np.fromfile(raw["lp"].valid_path, np.uint8).tolist() == [1, 0, 1]
    assert pa.ipc.open_file(spill.path).schema.names == ["heads"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=30), st.data())
def test_read_ranges_returns_every_range_in_order(tmp_path_factory, ranges, data):
    """Ranges in any order, empty, overlapping or following each other (merged into one read) come back as the
    file's bytes, back to back."""
    if data.draw(st.booleans()):  # runs of ranges that follow each other, the case reads are merged for
        ranges = [(sum(n for _, n in ranges[:i]), n) for i, (_, n) in enumerate(ranges)]
    content = bytes(range(256)) * 2
    path = tmp_path_factory.mktemp("ranges") / "f"
    path.write_bytes(content)
    starts = [start for start, _ in ranges]
    ends = [min(start + n, len(content)) for start, n in ranges]
    ends = [max(s, e) for s, e in zip(starts, ends, strict=True)]
    with open(path, "rb") as fh:
        got = _read_ranges(fh.fileno(), starts, ends)
    assert got.tobytes() == b"".join(content[s:e] for s, e in zip(starts, ends, strict=True))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 120), st.one_of(st.integers(0, 3), st.integers(0, 12))), max_size=40),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(0, 64),
    st.sampled_from([1, 4, 16, 64, 256]),
    st.sampled_from([1, 8, 32, 1024]),
    st.integers(0, 3),
    st.randoms(use_true_random=False),
)
def test_read_into_windows_give_every_range_its_place(
    tmp_path_factory, ranges, unit, hole, window, alone, repeats, rng
):
    """However the runs fall into read windows (staged reads of many runs across holes, a window split at its
    span, a long run read on its own, copies sliced a window of values at a time), every range lands at its
    destination: ranges in any order, overlapping or asked for several times, placed anywhere in the result, in
    values of any width."""
    ranges = ranges + ranges[: repeats * 3] * repeats  # a row asked for again (a ref row shared by samples)
    content = bytes(rng.randrange(256) for _ in range(130 * unit))
    path = tmp_path_factory.mktemp("windows") / "f"
    path.write_bytes(content)
    spans = [(start * unit, min(start + n, 130) * unit) for start, n in ranges]
    lengths = [end - start for start, end in spans]
    places = list(range(len(spans)))
    rng.shuffle(places)  # the result holds the ranges in another order than asked
    dest, at = [0] * len(spans), 0
    for i in places:
        dest[i], at = at, at + lengths[i]
    out = np.zeros(at, dtype=np.uint8)
    with pytest.MonkeyPatch.context() as mp, open(path, "rb") as fh:
        mp.setattr(spill_module, "_HOLE", hole * unit)
        mp.setattr(spill_module, "_WINDOW", window)
        mp.setattr(spill_module, "_ALONE", alone)
        spill_module._read_into(fh.fileno(), out, [s for s, _ in spans], [e for _, e in spans], dest, unit)
    expected = bytearray(at)
    for (start, end), d in zip(spans, dest, strict=True):
        expected[d : d + end - start] = content[start:end]
    assert out.tobytes() == bytes(expected)


def test_read_into_makes_a_system_call_per_window_not_per_run(tmp_path, monkeypatch):
    """1,000 rows of 40 bytes that follow each other in the file but not in the result (a shard of short samples,
    shuffled) are one read; rows 8 KiB apart are a read each; a long row is read on its own; a range that is not
    a whole number of values is still read exactly."""
    content = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    path = tmp_path / "f"
    path.write_bytes(content)
    calls = []
    real = os.preadv

    def counted(fd, buffers, offset):
        calls.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(spill_module.os, "preadv", counted)

    def read(starts, ends, dest, unit):
        calls.clear()
        out = np.zeros(int(max(d + e - s for s, e, d in zip(starts, ends, dest, strict=True))), dtype=np.uint8)
        with open(path, "rb") as fh:
            spill_module._read_into(fh.fileno(), out, starts, ends, dest, unit)
        for s, e, d in zip(starts, ends, dest, strict=True):
            assert out[d : d + e - s].tobytes() == content[s:e]
        return len(calls)

    starts = np.arange(1000) * 40
    dest = np.random.default_rng(1).permutation(1000) * 40
    assert read(starts, starts + 40, dest, 4) == 1
    assert read(starts * 200, starts * 200 + 40, dest, 4) == 1000  # 8,000-byte holes: a read per row
    assert read([0, 40, 500_000], [40, 80, 1_000_000], [0, 40, 80], 4) == 2  # the long row alone
    long = np.arange(8) * 4096  # rows of 1,024 values, one after another in the file: each read alone
    assert read(long, long + 4096, np.arange(8)[::-1] * 4096, 4) == 8
    assert read([1, 41], [40, 80], [0, 39], 4) == 1  # not whole values: read as bytes, still one read


def test_batches_whose_lists_are_all_empty(tmp_path):
    rows = [{"ids": [], "more": [], "lp": [], "mask": [], "heads": []}] * 3
    spill, kept = spill_of(tmp_path, rows, [], [True] * 3)
    flat = spill.flat(np.array(kept[::-1]), ["ids", "lp", "mask", ("ids", "more")])
    for spec in ("ids", "lp", "mask"):
        assert flat[spec].values_T.tolist() == [] and flat[spec].offsets_N1.tolist() == [0, 0, 0, 0]
    assert flat["mask"].values_T.dtype == np.bool_ and flat["lp"].values_T.dtype == np.float32


def test_located_rows_are_gathered_after_the_spill_forgets_its_own(tmp_path):
    rows = [
        {"ids": [1, 2], "more": [3], "lp": [-0.5, None], "mask": None, "heads": [[1]]},
        {"ids": [], "more": [4, 5], "lp": [-1.0], "mask": [True, False], "heads": None},
        {"ids": [6], "more": [], "lp": [], "mask": None, "heads": [[2, 3]]},
    ]
    spill, kept = spill_of(tmp_path, rows, [1], [True, False, True])
    assert kept == [0, 2]
    rows_N = np.array([2, 0, 2])
    located = spill.locate(rows_N, ["ids", "more", "mask"])
    assert {k: v.tolist() for k, v in located.items()} == {
        "spill_row": [1, 0, 1],  # the second scan row was never spilled
        "ids:start": [2, 0, 2],
        "ids:len": [1, 2, 1],
        "more:start": [1, 0, 1],
        "more:len": [0, 1, 0],
        "mask:start": [0, 0, 0],
        "mask:len": [0, 0, 0],
        "mask:valid": [False, False, False],
    }
    before = spill.flat(rows_N, [("ids", "more"), "mask"])
    spill.forget_rows()
    assert spill.rows_S.tolist() == [] and spill.raw["ids"].starts_S1.tolist() == [0]
    after = spill.flat_at(located, [("ids", "more"), "mask"])
    assert after[("ids", "more")].values_T.tolist() == [6, 1, 2, 3, 6] == before[("ids", "more")].values_T.tolist()
    assert [p.tolist() for p in after[("ids", "more")].part_lengths] == [[1, 2, 1], [0, 1, 0]]
    assert after["mask"].row_valid_N.tolist() == [False, False, False] == before["mask"].row_valid_N.tolist()
    assert spill.take_at(located["spill_row"], ["heads"]).to_pylist() == [
        {"heads": [[2, 3]]},
        {"heads": [[1]]},
        {"heads": [[2, 3]]},
    ]
    assert spill.take_at(np.zeros(0, dtype=np.int64), ["heads"]).num_rows == 0
    with pytest.raises(RuntimeError, match="were forgotten: read them through locate"):
        spill.locate(rows_N, ["ids"])
