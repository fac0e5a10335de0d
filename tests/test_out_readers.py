"""The reader matrix: every reader, pointed at a set folder, at ``OUT`` or at ``OUT/**/*.parquet``, reads exactly the
rows of the current sets (the manifests' parts), settled, while a build stages its set, at each step of a rebuild,
and after a build killed at each step of its publication or retirement.

Readers: DuckDB, polars, pyarrow, pandas, Hugging Face ``datasets``, prl's own :class:`~prl.loaders.ShardLoader`,
and Ray Data (its own test, marked ``campaign``: a Ray cluster takes seconds to start). pyarrow and pandas have no
glob: their recursive form reads every ``*.parquet`` file a recursive glob finds under ``OUT``, hidden folders
included (the strictest reading); prl's loader has one form per path.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import prl.shards.publish
from prl.loaders import ShardLoader
from prl.schema import CHECKS, REWARDS, TRACES
from prl.shards.build import build_shards
from prl.shards.layout import meta_root, staging_root
from prl.shards.listing import list_sets
from prl.shards.options import ShardOptions
from prl.shards.target import LocalOut
from prl.shards.verify import verify_shards
from prl.store.tables import Store
from tests.shards_fixtures import reward, table, trace, varied_store, verdict

Reader = Callable[[str], list[str]]
"""A path (a set folder, OUT, or the glob ``OUT/**/*.parquet``) → the sample ids of the rows read."""

OPTIONS = ShardOptions(target_tokens=120, seed=1)
REBUILT = ShardOptions(target_tokens=90, seed=2)


def _recursive(path: str) -> list[str]:
    return sorted(glob.glob(path, recursive=True, include_hidden=True))


def _duckdb(path: str) -> list[str]:
    return [r[0] for r in duckdb.execute(f"select sample_id from read_parquet('{path}')").fetchall()]


def _polars(path: str) -> list[str]:
    return pl.scan_parquet(path).select("sample_id").collect()["sample_id"].to_list()


def _pyarrow(path: str) -> list[str]:
    source: str | list[str] = _recursive(path) if "*" in path else path
    return ds.dataset(source, format="parquet").to_table(columns=["sample_id"])["sample_id"].to_pylist()


def _pandas(path: str) -> list[str]:
    if "*" in path:
        return [s for f in _recursive(path) for s in pd.read_parquet(f, columns=["sample_id"])["sample_id"]]
    return list(pd.read_parquet(path, columns=["sample_id"])["sample_id"])


def _prl(path: str) -> list[str]:
    if "*" in path:
        path = path.split("/**", 1)[0]
    loader = ShardLoader(path, batch_rows=1_000_000, layout="rows", shuffle=False, drop_uneven=False)
    return [str(s) for batch in loader for s in batch.sample_id_N]


def _datasets(cache: Path) -> Reader:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    calls = iter(range(10**6))

    def read(path: str) -> list[str]:
        where = {"data_files": path} if "*" in path else {"data_dir": path}
        loaded = datasets.load_dataset("parquet", **where, split="train", cache_dir=str(cache / str(next(calls))))
        return list(loaded["sample_id"])

    return read


def fast_readers(tmp_path: Path) -> dict[str, Reader]:
    return {
        "duckdb": _duckdb,
        "polars": _polars,
        "pyarrow": _pyarrow,
        "pandas": _pandas,
        "datasets": _datasets(tmp_path / "hf"),
        "prl": _prl,
    }


def current_rows(out: str) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """The truth: the sample ids of the parts the current sets' manifests name (``prl shards list``), in all and
    per set folder; each set's rows match its manifest's total."""
    per_set: dict[str, Counter[str]] = {}
    for listed in list_sets(out).sets:
        ids = [s for f in listed.files for s in pq.read_table(f, columns=["sample_id"])["sample_id"].to_pylist()]
        assert len(ids) == listed.rows
        per_set[listed.dir] = Counter(ids)
    return sum(per_set.values(), Counter()), per_set


def check_matrix(out: str, readers: dict[str, Reader]) -> Counter[str]:
    """Every reader × form reads exactly the current sets' rows; returns them."""
    everything, per_set = current_rows(out)
    assert per_set, "a state with no current set proves nothing"
    for name, read in readers.items():
        for folder, rows in per_set.items():
            assert Counter(read(folder)) == rows, (name, "set folder", folder)
        assert Counter(read(out)) == everything, (name, "OUT")
        assert Counter(read(f"{out}/**/*.parquet")) == everything, (name, "OUT/**/*.parquet")
    return everything


def _two_sets(tmp_path: Path) -> tuple[Store, str]:
    """A store and an OUT with two sets: a build, then a build of the samples committed after it."""
    store = varied_store(str(tmp_path / "store"), commits=2)
    out = str(tmp_path / "out")
    assert build_shards(store, out, options=OPTIONS).status == "built"
    extra = [trace(f"x{i}:0", f"gx{i // 2}", [1, 2], [3, 4, 5]) for i in range(6)]
    store.commit("traces", table(TRACES, extra).to_batches())
    store.commit(
        "rewards", table(REWARDS, [reward(t["sample_id"], float(i)) for i, t in enumerate(extra)]).to_batches()
    )
    store.commit("checks", table(CHECKS, [verdict(t["sample_id"]) for t in extra]).to_batches())
    assert build_shards(store, out, options=OPTIONS).status == "built"
    assert len(list_sets(out).sets) == 2
    return store, out


def test_settled_out_reads_exactly_in_every_reader(tmp_path):
    _, out = _two_sets(tmp_path)
    rows = check_matrix(out, fast_readers(tmp_path))
    assert max(rows.values()) == 1 and len(rows) > 20
    assert sorted(os.listdir(out)) == sorted(s.set_id for s in list_sets(out).sets)  # nothing else inside OUT
    assert verify_shards(out).ok


def test_during_a_build_and_each_step_of_a_rebuild_readers_see_complete_sets_only(tmp_path, monkeypatch):
    store, out = _two_sets(tmp_path)
    readers = fast_readers(tmp_path)
    old = check_matrix(out, readers)
    seen: list[str] = []
    publish, retire_one = LocalOut.publish, prl.shards.publish._retire

    def publishing(self, staging, set_id, check_lock):
        assert len(_recursive(f"{staging.parts}/*.parquet")) >= 1  # the set is staged, in full, beside OUT
        assert check_matrix(out, readers) == old
        seen.append("staged")
        return publish(self, staging, set_id, check_lock)

    def retiring(out_: str, set_id: str) -> None:
        rows = check_matrix(out, readers)  # the new set and the old ones not yet retired: each complete
        seen.append(f"retire {len(list_sets(out).sets)} sets")
        assert set(rows) == set(old) and max(rows.values()) == 2
        retire_one(out_, set_id)

    monkeypatch.setattr(LocalOut, "publish", publishing)
    monkeypatch.setattr(prl.shards.publish, "_retire", retiring)
    rebuilt = build_shards(store, out, options=REBUILT, rebuild=True)
    assert seen == ["staged", "retire 3 sets", "retire 2 sets"]
    assert [s.set_id for s in list_sets(out).sets] == [rebuilt.set_id]
    assert check_matrix(out, readers) == old  # the new set alone: every sample once


KILLED = textwrap.dedent(
    """
    import os, sys
    from prl.shards.build import build_shards
    from prl.shards.layout import retired_root, staging_root
    from prl.shards.options import ShardOptions
    store, out, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    real, moves = os.replace, [0]

    def replace(src, dst):
        # the renames that publish a set (out of staging) and retire one (into retired): killed before the k-th
        src, dst = str(src), str(dst)
        leaves = src.startswith(staging_root(out)) and not dst.startswith(staging_root(out))
        if leaves or dst.startswith(retired_root(out)):
            moves[0] += 1
            if moves[0] == kill_at:
                os._exit(137)
        return real(src, dst)

    os.replace = replace
    build_shards(store, out, options=ShardOptions(target_tokens=90, seed=2), rebuild=True)
    print("moves", moves[0])
    """
)


def _killed_rebuild(store: str, out: str, kill_at: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", KILLED, store, out, str(kill_at)], capture_output=True, text=True, env=env, check=False
    )


@pytest.mark.parametrize(
    "kill_at",  # 2 (meta moved, rows not) and 4 (one old set half retired) in every run, the rest in campaigns
    [pytest.param(k, marks=pytest.mark.campaign) if k % 2 else k for k in range(1, 6)],
)
def test_after_a_build_killed_at_each_rename_readers_read_the_complete_sets(tmp_path, kill_at):
    """A rebuild of an OUT of two sets moves: the new set's meta, its rows (the commit), then each old set's rows
    and meta (4 moves of retirement). Killed before move ``kill_at``, it leaves complete sets only: old ones, old
    and new, or the new one; the next build removes what it left and every sample is in OUT once."""
    store, out = _two_sets(tmp_path)
    readers = fast_readers(tmp_path)
    old = check_matrix(out, readers)
    done = _killed_rebuild(str(tmp_path / "store"), out, kill_at)
    assert done.returncode == 137, done.stderr[-2000:]
    rows = check_matrix(out, readers)
    sets = len(list_sets(out).sets)
    assert (sets, max(rows.values())) == {1: (2, 1), 2: (2, 1), 3: (3, 2), 4: (2, 2), 5: (2, 2)}[kill_at]
    assert set(rows) == set(old)
    if kill_at <= 2:  # the killed build's staging is still there, beside OUT
        assert os.listdir(staging_root(out))
    again = build_shards(store, out, options=REBUILT, rebuild=True)
    assert again.status == "built" and [s.set_id for s in list_sets(out).sets] == [again.set_id]
    assert check_matrix(out, readers) == old
    assert not os.path.exists(staging_root(out)) and verify_shards(out).ok
    assert sorted(os.listdir(meta_root(out))) == ["frontier", "frontier.json", "index.json", "out.json", "sets"]


def test_a_rebuild_that_is_not_killed_makes_six_moves(tmp_path):
    """The count the kill points above rely on: 2 to publish, 2 per retired set."""
    _two_sets(tmp_path)
    done = _killed_rebuild(str(tmp_path / "store"), str(tmp_path / "out"), 0)
    assert done.returncode == 0 and done.stdout.split()[-2:] == ["moves", "6"], done.stderr[-2000:]


def _ray_reader() -> tuple[Reader, Callable[[], None]]:
    ray = pytest.importorskip("ray")
    ray_data = pytest.importorskip("ray.data")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)

    def read(path: str) -> list[str]:
        source: str | list[str] = _recursive(path) if "*" in path else path
        return [r["sample_id"] for r in ray_data.read_parquet(source).select_columns(["sample_id"]).take_all()]

    return read, ray.shutdown


@pytest.mark.campaign
def test_ray_data_reads_exactly_settled_during_a_rebuild_and_after_a_kill(tmp_path, monkeypatch):
    """Ray Data's column of the matrix (a Ray cluster takes seconds to start, and each read a few more)."""
    store, out = _two_sets(tmp_path)
    read, shutdown = _ray_reader()
    try:
        readers = {"ray": read}
        old = check_matrix(out, readers)
        retire_one = prl.shards.publish._retire
        during: list[Counter[str]] = []

        def retiring(out_: str, set_id: str) -> None:
            if not during:
                during.append(check_matrix(out, readers))  # the new set beside both old ones, each complete
            retire_one(out_, set_id)

        with monkeypatch.context() as patched:
            patched.setattr(prl.shards.publish, "_retire", retiring)
            build_shards(store, out, options=REBUILT, rebuild=True)
        assert during[0] == old + old
        assert check_matrix(out, readers) == old
        done = _killed_rebuild(str(tmp_path / "store"), out, 1)  # the same set again, killed before its first move
        assert done.returncode == 137 and check_matrix(out, readers) == old
    finally:
        shutdown()


def test_a_set_folder_holds_only_parquet_parts_and_out_only_set_folders(tmp_path):
    """What polars needs to read ``OUT`` as a folder: every file under it is a Parquet part of one schema."""
    _, out = _two_sets(tmp_path)
    files = [p for p in Path(out).rglob("*") if p.is_file()]
    assert files and all(p.suffix == ".parquet" and p.name.startswith("part-") for p in files)
    schemas = {pq.read_schema(p).remove_metadata() for p in files}
    assert len(schemas) == 1 and pa.schema(next(iter(schemas))).names[0] == "sample_id"
