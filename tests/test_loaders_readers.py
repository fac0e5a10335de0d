"""A set folder reads as exactly its rows with the readers trainers use; globs over OUT see only current sets.

pyarrow.dataset, pandas, polars, DuckDB and Hugging Face ``datasets`` (the ``test`` extra) run on every test run; Ray
Data runs when it is installed (``prl[ray]``). The whole reader matrix, ``OUT`` and its recursive globs included, is
``tests/test_out_readers.py``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from prl.schema import CHECKS, REWARDS, TRACES
from prl.shards.build import build_shards
from prl.shards.layout import retired_root, staging_root
from prl.shards.listing import list_sets
from prl.shards.options import ShardOptions
from tests.shards_fixtures import reward, table, trace, varied_store, verdict


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """OUT with two sets (a build, then an incremental one), a build in progress, and leftovers of a replaced
    set in the retired area."""
    root = tmp_path_factory.mktemp("readers")
    store = varied_store(str(root / "store"))
    opts = ShardOptions(kl="column", missing_ref="drop", topk="auto", target_tokens=150)
    first = build_shards(store, str(root / "out"), options=opts)
    extra = [trace(f"x{i}:0", f"gx{i // 2}", [1, 2], [3, 4, 5]) for i in range(4)]
    store.commit("traces", table(TRACES, extra).to_batches())
    store.commit(
        "rewards", table(REWARDS, [reward(t["sample_id"], float(i)) for i, t in enumerate(extra)]).to_batches()
    )
    store.commit("checks", table(CHECKS, [verdict(t["sample_id"]) for t in extra]).to_batches())
    second = build_shards(store, str(root / "out"), options=ShardOptions(target_tokens=150))
    assert first.status == second.status == "built" and second.rows >= 4 and len(first.shards) > 1
    outdir = root / "out"
    # a build in progress and a set being retired: parts in place, never visible
    for area in (staging_root(str(outdir)), retired_root(str(outdir))):
        busy = Path(area) / f"{first.set_id}-999999-deadbeef" / "parts"
        busy.mkdir(parents=True)
        shutil.copy(os.path.join(first.set_dir, first.shards[0]["file"]), busy / "part-00000.parquet")
    return outdir


def sets_of(out: Path) -> list:
    return list_sets(str(out)).sets


def expected_ids(folder: str) -> list[str]:
    """The sample ids of a set's parts, read file by file."""
    parts = sorted(Path(folder).glob("part-*.parquet"))
    return sorted(sid for p in parts for sid in pq.read_table(p, columns=["sample_id"])["sample_id"].to_pylist())


def test_each_set_folder_is_exactly_its_rows(out):
    for listed in sets_of(out):
        folder, rows = listed.dir, listed.rows
        want = expected_ids(folder)
        assert len(want) == rows
        assert sorted(os.listdir(folder)) == sorted(os.path.basename(f) for f in listed.files)
        readers = {
            "pyarrow.dataset": lambda f=folder: ds.dataset(f, format="parquet").to_table(columns=["sample_id"]),
            "pq.read_table": lambda f=folder: pq.read_table(f, columns=["sample_id"]),
            "pandas": lambda f=folder: pa.Table.from_pandas(
                __import__("pandas").read_parquet(f, columns=["sample_id"])
            ),
            "polars dir": lambda f=folder: pl.scan_parquet(f).select("sample_id").collect().to_arrow(),
            "polars glob": lambda f=folder: pl.scan_parquet(f"{f}/*.parquet").select("sample_id").collect().to_arrow(),
            "polars **": lambda f=folder: pl.scan_parquet(f"{f}/**/*.parquet").select("sample_id").collect().to_arrow(),
        }
        for name, read in readers.items():
            got = sorted(read()["sample_id"].to_pylist())
            assert got == want, name


def test_duckdb_reads_a_set_folder_and_the_globs_over_out(out):
    duckdb = pytest.importorskip("duckdb")
    for listed in sets_of(out):
        for pattern in ("*.parquet", "**/*.parquet", "part-*.parquet"):
            rows = duckdb.execute(f"select count(*), count(distinct sample_id) from '{listed.dir}/{pattern}'")
            assert rows.fetchone() == (listed.rows, listed.rows), pattern
    total = sum(s.rows for s in sets_of(out))
    for pattern in ("*/part-*.parquet", "*/*.parquet"):
        rows = duckdb.execute(f"select count(*), count(distinct sample_id) from '{out}/{pattern}'")
        assert rows.fetchone() == (total, total), pattern
    # what prl shards list returns is what the globs see
    listed = sorted(f for s in sets_of(out) for f in s.files)
    got = duckdb.execute(f"select distinct filename from read_parquet('{out}/*/*.parquet', filename=true)")
    assert sorted(r[0] for r in got.fetchall()) == listed


def test_globs_over_out_see_only_current_sets(out):
    total = sum(s.rows for s in sets_of(out))
    for pattern in ("*/part-*.parquet", "*/*.parquet"):
        frame = pl.scan_parquet(f"{out}/{pattern}").select("sample_id").collect()
        assert frame.height == total and frame["sample_id"].n_unique() == total, pattern
    assert ds.dataset(str(out), format="parquet").count_rows() == total  # hidden .prl/ is skipped
    assert sorted(str(p) for p in out.glob("*/*.parquet")) == sorted(f for s in sets_of(out) for f in s.files)


def test_a_set_rebuilt_replaces_the_old_sets_for_globs(tmp_path):
    store = varied_store(str(tmp_path / "store"), commits=2)
    outdir = tmp_path / "out"
    build_shards(store, str(outdir), options=ShardOptions(target_tokens=100, seed=1))
    build_shards(store, str(outdir), options=ShardOptions(target_tokens=100, seed=2), rebuild=True)
    [current] = sets_of(outdir)
    frame = pl.scan_parquet(f"{outdir}/*/part-*.parquet").select("sample_id").collect()
    assert frame.height == current.rows == frame["sample_id"].n_unique()


def test_hugging_face_datasets_reads_exactly_the_rows(out, tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    for listed in sets_of(out):
        by_dir = datasets.load_dataset("parquet", data_dir=listed.dir, split="train", cache_dir=str(tmp_path / "c"))
        by_glob = datasets.load_dataset(
            "parquet", data_files=f"{listed.dir}/*.parquet", split="train", cache_dir=str(tmp_path / "c")
        )
        assert sorted(by_dir["sample_id"]) == sorted(by_glob["sample_id"]) == expected_ids(listed.dir)


@pytest.mark.slow
@pytest.mark.campaign  # Ray Data starts a local instance: `make test-all`
def test_ray_data_reads_exactly_the_rows(out):
    ray = pytest.importorskip("ray")
    ray_data = pytest.importorskip("ray.data")

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        for listed in sets_of(out):
            rows = ray_data.read_parquet(listed.dir).select_columns(["sample_id"]).take_all()
            assert sorted(r["sample_id"] for r in rows) == expected_ids(listed.dir)
    finally:
        ray.shutdown()
