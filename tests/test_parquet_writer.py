"""What build-shards writes is ordinary Parquet: pyarrow and polars read a shard back exactly, with the encodings
the shard format promises (zstd, byte-stream-split floats, no dictionary on lists, statistics on scalars)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from prl.schema import SHARD, float_leaves
from prl.shards import writer
from prl.shards.build import build_shards
from prl.shards.layout import meta_root
from prl.shards.options import ShardOptions
from prl.shards.writer import FLOAT_LEAVES, SHARD_STATISTICS, WRITER, HashingFile, read_ipc, write_shard
from tests.shards_fixtures import make_store, ref, reward, trace


def canonical(value: object) -> object:
    """Rows as comparable values: floats by repr (so -0.0 ≠ 0.0 and NaN == NaN)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


def shard_rows(n: int = 40, seed: int = 2) -> pa.Table:
    """A table in the SHARD schema with nulls at every level a shard allows them."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        p, c = int(rng.integers(1, 30)), int(rng.integers(0, 30))
        head = None if i % 7 == 0 else rng.integers(0, 1000, (c, 3)).tolist()
        rows.append(
            {
                "sample_id": f"s{i}",
                "group_id": f"g{i // 4}",
                "policy_version": None if i % 5 == 0 else "v1",
                "staleness": None if i % 5 == 0 else int(rng.integers(0, 3)),
                "input_ids": rng.integers(0, 129280, p + c).tolist(),
                "prompt_len": p,
                "loss_mask": (rng.random(c) < 0.8).tolist(),
                "behavior_logprobs": [None if j % 11 == 3 else float(v) for j, v in enumerate(-rng.exponential(1, c))],
                "ref_logprobs": None if i % 3 == 0 else (-rng.exponential(1, c)).tolist(),
                "kl": None if i % 3 == 0 else [None if j % 9 == 4 else 0.1 for j in range(c)],
                "token_advantages": rng.normal(0, 1, c).tolist(),
                "reward": float(i % 2),
                "advantage": float(i % 2) - 0.5,
                "group_size": 4,
                "topk_ids": head,
                "topk_logprobs": None if head is None else (-rng.exponential(1, (c, 3))).tolist(),
            }
        )
    return pa.Table.from_pylist(rows, schema=SHARD)


def assert_reads_back(path: Path, table: pa.Table) -> None:
    back = pq.read_table(path)
    assert back.schema.equals(table.schema, check_metadata=False)
    assert back.equals(table)
    assert canonical(back.to_pylist()) == canonical(table.to_pylist())
    assert canonical(pl.read_parquet(path).to_dicts()) == canonical(table.to_pylist())


def built_set(tmp_path: Path) -> tuple[str, dict]:
    """A set built with KL, masks, heads and a null logprob; returns (set folder, manifest)."""
    traces = []
    for i in range(12):
        completion = list(range(10 + i, 14 + i))
        lps = [-0.5, -0.25, None if i == 3 else -1.0, -2.0]
        traces.append(
            trace(
                f"s{i}:0",
                f"g{i // 3}",
                [1, 2, i],
                completion,
                completion_logprobs=lps,
                completion_mask=[True, i % 2 == 0, True, True] if i % 4 == 0 else None,
                topk_ids=[[t, t + 1, t + 2] for t in completion],
                topk_logprobs=[[-0.1, -2.5, -3.0]] * 4,
            )
        )
    rewards = [reward(t["sample_id"], float(i % 2)) for i, t in enumerate(traces)]
    refs = [ref(t["sample_id"], [-0.6, -0.2, -1.5, -1.0]) for t in traces]
    store = make_store(str(tmp_path / "store"), traces, rewards, refs=refs)
    options = ShardOptions(kl="advantages", kl_coef=0.1, topk=2, target_tokens=30)
    result = build_shards(store, str(tmp_path / "out"), options=options)
    assert result.status == "built" and len(result.shards) > 1
    manifest = json.loads(Path(result.manifest_path or "").read_text())
    return result.set_dir or "", manifest


def test_a_shard_reads_back_exactly_with_pyarrow_and_polars(tmp_path):
    table = shard_rows()
    path = tmp_path / "part.parquet"
    size, sha256 = write_shard(table, str(path))
    data = path.read_bytes()
    assert (size, sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert_reads_back(path, table)


def test_a_built_sets_shards_read_back_and_match_their_manifest(tmp_path):
    set_dir, manifest = built_set(tmp_path)
    rows = 0
    for entry in manifest["shards"]:
        path = Path(set_dir, entry["file"])
        data = path.read_bytes()
        assert (entry["bytes"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
        table = pq.read_table(path)
        assert table.schema.equals(SHARD, check_metadata=False)
        assert canonical(pl.read_parquet(path).to_dicts()) == canonical(table.to_pylist())
        rows += table.num_rows
    assert rows == manifest["totals"]["rows"] == 12
    meta = Path(meta_root(Path(set_dir).parent)) / "sets" / Path(set_dir).name  # prl.shards.layout
    samples = read_ipc(str(meta / manifest["samples"]["file"]))
    assert samples["sample_id"].to_pylist() == sorted(f"s{i}:0" for i in range(12))


def test_encodings_are_zstd_byte_stream_split_floats_and_plain_lists(tmp_path):
    set_dir, manifest = built_set(tmp_path)
    metadata = pq.read_metadata(Path(set_dir, manifest["shards"][0]["file"]))
    assert metadata.num_row_groups == 1
    assert metadata.created_by.startswith(f"parquet-cpp-arrow version {pa.__version__}")
    group = metadata.row_group(0)
    leaves = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    assert set(FLOAT_LEAVES) == set(float_leaves(SHARD)) and set(FLOAT_LEAVES) <= set(leaves)
    for path, column in leaves.items():
        assert column.compression == "ZSTD", path
        if path in FLOAT_LEAVES:
            assert "BYTE_STREAM_SPLIT" in column.encodings, path
        if "." in path:  # a list column's leaf: no dictionary
            assert "PLAIN_DICTIONARY" not in column.encodings and "RLE_DICTIONARY" not in column.encodings, path
        if path in SHARD_STATISTICS:
            assert column.is_stats_set and column.statistics.has_min_max, path
        elif path in ("input_ids.list.element", "sample_id"):
            assert not column.is_stats_set, path


def test_statistics_hold_the_columns_bounds(tmp_path):
    table = shard_rows()
    path = tmp_path / "part.parquet"
    write_shard(table, str(path))
    group = pq.read_metadata(path).row_group(0)
    by_name = {group.column(i).path_in_schema: group.column(i).statistics for i in range(group.num_columns)}
    assert (by_name["prompt_len"].min, by_name["prompt_len"].max) == (
        min(table["prompt_len"].to_pylist()),
        max(table["prompt_len"].to_pylist()),
    )
    assert by_name["staleness"].null_count == table["staleness"].null_count == 8
    assert (by_name["advantage"].min, by_name["advantage"].max) == (-0.5, 0.5)


def test_same_table_same_bytes_and_the_writer_names_pyarrow(tmp_path):
    table = shard_rows(seed=5)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    assert write_shard(table, str(a)) == write_shard(table, str(b))
    assert a.read_bytes() == b.read_bytes()
    assert f"pyarrow {pa.__version__}" == WRITER


def test_empty_shard_and_empty_sample_ids(tmp_path):
    empty = SHARD.empty_table()
    path = tmp_path / "empty.parquet"
    write_shard(empty, str(path))
    assert_reads_back(path, empty)
    ids = tmp_path / "ids.arrow"
    size, sha256 = writer.write_sample_ids(pa.array([], pa.string()), str(ids))
    assert (size, sha256) == (ids.stat().st_size, hashlib.sha256(ids.read_bytes()).hexdigest())
    assert writer.read_ipc(str(ids)).num_rows == 0


def test_hashing_file_counts_and_hashes_every_write(tmp_path):
    path = tmp_path / "f.bin"
    with HashingFile(str(path)) as fh:
        assert fh.writable() and not fh.readable()
        assert fh.write(b"abc") == 3
        assert fh.write(memoryview(b"defg")) == 4
        assert fh.write(pa.py_buffer(b"h" * 5000)) == 5000
        assert fh.tell() == fh.size == 5007
    assert fh.closed
    data = path.read_bytes()
    assert data == b"abcdefg" + b"h" * 5000
    assert fh.hexdigest() == hashlib.sha256(data).hexdigest()
    fh.close()  # closing twice is harmless
