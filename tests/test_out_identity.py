"""Which folders may be an OUT, and how an OUT is known: by the marker beside it, never by its spelling.

An OUT is missing, empty, or a prl OUT of this layout; a folder of other files, an OUT of an earlier layout, a
folder inside the store (or holding it) and a mount point of its own are refused with exit 2 before anything is
written. Two spellings of one OUT (a symbolic link, a bind mount of a folder above it) take one build lock, so
they never build side by side, and a build through one spelling skips what a build through the other shipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.errors import LockedError, UsageError
from prl.schema import CHECKS, REWARDS, TRACES
from prl.shards.build import build_shards
from prl.shards.layout import marker_path, meta_root, out_state
from prl.shards.listing import list_sets
from prl.shards.options import ShardOptions
from prl.shards.publish import ensure_marker
from prl.shards.s3out import S3Out
from prl.shards.target import LocalOut
from prl.shards.verify import verify_shards
from prl.store.locks import holding
from tests.s3_server import moto_endpoint, s3  # noqa: F401
from tests.shards_fixtures import random_store, reward, table, trace, verdict

runner = CliRunner()
OPTIONS = ShardOptions(target_tokens=50)


def build(store: str, out: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["build-shards", "--store", store, "--out", out, "--json"])
    return res.exit_code, json.loads(res.stdout) if res.stdout.strip().startswith("{") else {}


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture
def store(tmp_path) -> str:
    random_store(str(tmp_path / "store"), 4, 2)
    return str(tmp_path / "store")


@pytest.mark.parametrize("inside", ["", "traces", "rewards", "_index", "_index/traces/x", "_locks", "new/deep"])
def test_an_out_inside_the_store_is_refused_and_nothing_is_written(store, inside):
    before = tree(Path(store))
    code, summary = build(store, os.path.join(store, inside))
    assert code == 2 and summary["exit_code"] == 2
    assert "inside the store" in summary["error"]
    assert tree(Path(store)) == before  # no set, no meta folder, no lock file


def test_an_out_inside_the_store_by_another_spelling_is_refused(store, tmp_path):
    (tmp_path / "link").symlink_to(store)
    code, summary = build(store, str(tmp_path / "link" / "traces"))
    assert code == 2 and "inside the store" in summary["error"]
    code, summary = build(str(tmp_path / "link"), os.path.join(store, "traces"))  # the store spelled otherwise
    assert code == 2 and "inside the store" in summary["error"]


def test_an_out_holding_the_store_is_refused(tmp_path):
    random_store(str(tmp_path / "out" / "store"), 4, 2)
    with pytest.raises(UsageError, match="holds the store"):
        LocalOut(str(tmp_path / "out")).check(str(tmp_path / "out" / "store"))


def test_a_folder_of_other_files_is_refused_as_out(store, tmp_path):
    out = tmp_path / "etc"
    out.mkdir()
    (out / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (out / "hosts").write_text("127.0.0.1 localhost\n")
    code, summary = build(store, str(out))
    assert code == 2 and "no prl shard output" in summary["error"]
    assert tree(out) == ["hosts", "passwd"] and not os.path.exists(meta_root(str(out)))
    plain = tmp_path / "file"
    plain.write_text("x")
    code, summary = build(store, str(plain))
    assert code == 2 and "is not a folder" in summary["error"]


def test_an_empty_or_missing_folder_or_a_prl_out_is_accepted(store, tmp_path):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "missing" / "deep"):
        code, summary = build(store, str(out))
        assert code == 0 and summary["status"] == "built"
        assert out_state(str(out)) == "prl"
        code, summary = build(store, str(out))
        assert code == 0 and summary["status"] == "nothing_new"


def test_an_out_of_the_earlier_layout_is_refused_by_builds_and_readers(store, tmp_path):
    """An OUT whose bookkeeping is inside it (``OUT/.prl/``) is neither continued nor read, with a clear error."""
    out = tmp_path / "old"
    code, summary = build(store, str(out))
    assert code == 0
    set_id = summary["set_id"]
    shutil.move(meta_root(str(out)), out / ".prl")  # what the earlier layout kept inside OUT
    before = tree(out)
    code, summary = build(store, str(out))
    assert code == 2 and "earlier prl" in summary["error"]
    for command in (["shards", "list", str(out)], ["verify", str(out)], ["verify", str(out / set_id)]):
        res = runner.invoke(app, [*command, "--json"])
        assert res.exit_code == 2 and "earlier prl" in json.loads(res.stdout)["error"], command
    assert tree(out) == before


def test_two_spellings_take_one_lock(store, tmp_path):
    real = tmp_path / "data" / "out"
    real.parent.mkdir()
    (tmp_path / "alias").symlink_to(real.parent)
    step = LocalOut(str(real)).lock_step()
    assert LocalOut(str(tmp_path / "alias" / "out")).lock_step() == step
    assert LocalOut(str(tmp_path / "data" / ".." / "data" / "out")).lock_step() == step
    with holding(store, step), pytest.raises(LockedError):
        build_shards(store, str(tmp_path / "alias" / "out"), options=OPTIONS)
    assert list_sets(str(real)).sets == []


def test_the_marker_is_made_once_when_builds_race(tmp_path):
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(ensure_marker(str(tmp_path / "out")))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and json.loads(Path(marker_path(str(tmp_path / "out"))).read_text())["out_id"] == ids[0]
    assert os.listdir(meta_root(str(tmp_path / "out"))) == ["out.json"]  # no temporary file left


def _more_samples(store_path: str) -> None:
    from prl.store.tables import Store

    store = Store(store_path)
    extra = [trace(f"x{i}:0", f"gx{i // 2}", [1, 2], [3, 4, 5]) for i in range(4)]
    store.commit("traces", table(TRACES, extra).to_batches())
    store.commit(
        "rewards", table(REWARDS, [reward(t["sample_id"], float(i)) for i, t in enumerate(extra)]).to_batches()
    )
    store.commit("checks", table(CHECKS, [verdict(t["sample_id"]) for t in extra]).to_batches())


def _ships_once_through(store: str, first: str, second: str) -> None:
    code, summary = build(store, first)
    assert code == 0 and summary["rows"] == 8
    _more_samples(store)
    code, summary = build(store, second)
    assert code == 0 and summary["status"] == "built" and summary["rows"] == 4  # only the new samples
    result = verify_shards(first)
    assert result.ok and result.rows == 12 and len(result.sets) == 2


def test_a_symlinked_out_never_ships_twice(store, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "out")
    _ships_once_through(store, str(tmp_path / "out"), str(tmp_path / "link"))


def _bind(source: Path, target: Path) -> None:
    target.mkdir()
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mount --bind is not permitted here: {done.stderr.strip()}")


def _unbind(target: Path) -> None:
    subprocess.run(["umount", str(target)], check=False)


def test_an_out_through_a_bind_mount_takes_the_same_lock_and_never_ships_twice(store, tmp_path):
    data, bound = tmp_path / "data", tmp_path / "bound"
    data.mkdir()
    _bind(data, bound)
    try:
        assert LocalOut(str(bound / "out")).lock_step() == LocalOut(str(data / "out")).lock_step()
        with holding(store, LocalOut(str(data / "out")).lock_step()), pytest.raises(LockedError):
            build_shards(store, str(bound / "out"), options=OPTIONS)
        _ships_once_through(store, str(data / "out"), str(bound / "out"))
    finally:
        _unbind(bound)


def test_an_out_that_is_a_mount_point_of_its_own_is_refused(store, tmp_path):
    """Its meta folder beside it is on another mount, where no rename reaches: exit 2, and nothing published."""
    data = tmp_path / "data"
    data.mkdir()
    _bind(data, tmp_path / "mnt")
    try:
        code, summary = build(store, str(tmp_path / "mnt"))
        assert code == 2 and "mount point" in summary["error"]
        assert os.listdir(data) == []
    finally:
        _unbind(tmp_path / "mnt")


@pytest.mark.s3
def test_s3_outs_are_refused_inside_an_s3_store_at_a_bucket_root_and_when_foreign(s3, tmp_path):  # noqa: F811
    store = str(tmp_path / "store")
    random_store(store, 4, 2)
    s3.put("etc/passwd", b"root:x:0:0")
    for out, why in (
        (s3.url("etc"), "no prl shard output"),
        (f"s3://{s3.bucket}", "needs a prefix"),
    ):
        with pytest.raises(UsageError, match=why):
            build_shards(store, out, options=OPTIONS)
    with pytest.raises(UsageError, match="inside the store"):
        S3Out(s3.url("store/traces")).check_out(s3.url("store"))
    assert sorted(s3.keys("")) == ["etc/passwd"]  # nothing written


@pytest.mark.s3
def test_an_s3_out_holds_only_its_rows_and_its_meta_sits_beside_it(s3, tmp_path):  # noqa: F811
    store = str(tmp_path / "store")
    random_store(store, 4, 2)
    result = build_shards(store, s3.url("runs/out"), options=OPTIONS)
    inside = s3.keys("runs/out/")
    assert inside and all(k.startswith(f"runs/out/{result.set_id}/part-") and k.endswith(".parquet") for k in inside)
    meta = sorted(k for k in s3.keys("runs/.out.prl/") if "/frontier" not in k)
    assert meta == [
        "runs/.out.prl/index.json",
        "runs/.out.prl/out.json",
        f"runs/.out.prl/sets/{result.set_id}/manifest.json",
        f"runs/.out.prl/sets/{result.set_id}/sample_ids.arrow",
    ]
    old = s3.url("old")
    s3.put(f"old/{result.set_id}/part-00000.parquet", b"PAR1")
    s3.put(f"old/.prl/sets/{result.set_id}/manifest.json", b"{}")  # the earlier layout: meta inside OUT
    with pytest.raises(UsageError, match="earlier prl"):
        build_shards(store, old, options=OPTIONS)


def test_a_store_through_a_symlink_or_a_bind_mount_takes_the_same_lock(store, tmp_path):
    """The store's locks are flocks on files inside it: every spelling reaches the same file."""
    (tmp_path / "store-link").symlink_to(store)
    step = LocalOut(str(tmp_path / "out")).lock_step()
    with holding(store, step), pytest.raises(LockedError):
        build_shards(str(tmp_path / "store-link"), str(tmp_path / "out"), options=OPTIONS)
    _bind(Path(store), tmp_path / "store-bound")
    try:
        with holding(store, step), pytest.raises(LockedError):
            build_shards(str(tmp_path / "store-bound"), str(tmp_path / "out"), options=OPTIONS)
    finally:
        _unbind(tmp_path / "store-bound")
