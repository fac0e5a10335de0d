"""build-shards and its lock: a build whose lock is taken over before it publishes publishes nothing (exit 3), and
two spellings of one OUT (a symlink; ``s3://b//out/``) never build at once (the second exits 3)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import prl.shards.build as build
from prl.cli import app
from prl.shards.listing import list_sets
from prl.shards.s3out import S3Out
from prl.shards.target import LocalOut
from prl.store import holder
from prl.store.locks import holding
from prl.store.tables import Store
from tests.s3_server import moto_endpoint, s3  # noqa: F401
from tests.shards_fixtures import random_store
from tests.test_locks import take_over

runner = CliRunner()


def out_of(kind: str, s3, tmp_path) -> str:  # noqa: F811
    return s3.url("out") if kind == "s3" else str(tmp_path / "out")


def published(out: str, s3) -> list[str]:  # noqa: F811
    """Every file of OUT: objects under the S3 prefix, or files under the folder."""
    if out.startswith("s3://"):
        return s3.keys("out/")
    return [os.path.join(r, n) for r, _, names in os.walk(out) for n in names] if os.path.isdir(out) else []


@pytest.mark.s3
@pytest.mark.parametrize(("store_kind", "out_kind"), [("local", "local"), ("local", "s3"), ("s3", "s3")])
def test_a_build_whose_lock_is_taken_over_before_publishing_publishes_nothing(
    store_kind,
    out_kind,
    s3,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    store_uri = s3.url("store") if store_kind == "s3" else str(tmp_path / "store")
    random_store(store_uri, 6, 2)
    out = out_of(out_kind, s3, tmp_path)
    real_write, thieves = build._manifest, []

    def write_then_lose_the_lock(*args, **kwargs):
        manifest = real_write(*args, **kwargs)
        location = Store(store_uri).location
        [lock] = [lock for lock in holder._held[location] if lock.step.startswith("build-shards-")]
        thieves.append(take_over(lock))
        return manifest

    monkeypatch.setattr(build, "_manifest", write_then_lose_the_lock)
    res = runner.invoke(app, ["build-shards", "--store", store_uri, "--out", out, "--json"])
    assert res.exit_code == 3, res.output
    assert "taken over by another run" in json.loads(res.stdout)["error"]
    assert published(out, s3) == []  # no part, no manifest, no index, no staging
    thieves[0].release()
    monkeypatch.setattr(build, "_manifest", real_write)
    again = runner.invoke(app, ["build-shards", "--store", store_uri, "--out", out, "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["rows"] == 12
    assert [s.rows for s in list_sets(out).sets] == [12]


def test_a_build_into_a_local_out_spelled_another_way_exits_3(tmp_path):
    store = str(tmp_path / "store")
    random_store(store, 2, 2)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(out, tmp_path / "link")
    with holding(store, LocalOut(str(out)).lock_step()) as held:
        for spelling in (tmp_path / "link", f"{tmp_path}//link/"):
            res = runner.invoke(app, ["build-shards", "--store", store, "--out", str(spelling), "--json"])
            assert res.exit_code == 3
            assert held.run_id in json.loads(res.stdout)["error"]
    assert os.listdir(out) == []
    res = runner.invoke(app, ["build-shards", "--store", store, "--out", str(tmp_path / "link"), "--json"])
    assert res.exit_code == 0 and [s.rows for s in list_sets(str(out)).sets] == [4]


@pytest.mark.s3
def test_a_build_into_an_s3_out_spelled_another_way_exits_3(s3, tmp_path):  # noqa: F811
    store = str(tmp_path / "store")
    random_store(store, 2, 2)
    with holding(store, S3Out(s3.url("runs/out")).lock_step()) as held:
        for spelling in (s3.url("runs/out/"), s3.url("runs//out//")):
            res = runner.invoke(app, ["build-shards", "--store", store, "--out", spelling, "--json"])
            assert res.exit_code == 3 and held.run_id in json.loads(res.stdout)["error"]
    assert s3.keys() == ["runs/.out.prl/out.json"]  # the marker the lock is keyed by, and nothing else
