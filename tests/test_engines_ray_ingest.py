"""ingest on the Ray engine against the local engine, on the session's two-node cluster on 127.0.0.1
(``ray_cluster``, :mod:`tests.conftest`): the same rows in traces, quarantine and rewards, the same ledger and
resume points, the same summary; the lock still answers exit 3; an ``s3://`` store and sources work from the
workers with the driver's AWS environment."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from prl.errors import LockedError
from prl.ingestion.traces import ingest
from prl.pipeline import runner
from prl.pipeline.recipe import from_mapping
from prl.store.locks import holding
from prl.store.tables import Store
from tests.engine_cases import chat, ingest_summary, same_stores, source_folder, table
from tests.s3_server import moto_endpoint, s3  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.campaign,  # a Ray cluster: `make test-all`
    pytest.mark.xdist_group("ray"),  # one cluster per session: every Ray test in one xdist worker
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the prl[ray] extra"),
]


def test_ingest_on_ray_commits_the_rows_local_does(tmp_path, ray_cluster):
    sources = source_folder(tmp_path / "in")
    local, remote = Store(str(tmp_path / "local")), Store(str(tmp_path / "ray"))
    first = ingest([str(sources)], local)
    on_ray = ingest([str(sources)], remote, engine="ray")
    assert (first.samples, first.already_present, first.quarantined) == (
        13,
        2,
        {"malformed_json": 1, "no_token_ids": 1, "duplicate_sample_id": 2},
    )
    assert [f.held_back_bytes for f in first.files][:1] == [40]
    assert ingest_summary(on_ray) == ingest_summary(first)
    same_stores(local, remote)
    assert len(table(local, "rewards")) == 1

    with open(sources / "a.jsonl", "ab") as fh:  # the line ends, and one more follows: both runs read on from it
        fh.write(json.dumps(chat(4)).encode()[40:] + b"\n" + json.dumps(chat(5)).encode() + b"\n")
    second, second_on_ray = ingest([str(sources)], local), ingest([str(sources)], remote, engine="ray")
    resumed = {Path(f.uri).name: f.resumed_from for f in second.files}
    assert (second.samples, resumed) == (
        4,
        {"a.jsonl": first.files[0].bytes - 40, "b.jsonl.gz": 0, "c.jsonl": 0, "d.jsonl": 0},
    )
    assert ingest_summary(second_on_ray) == ingest_summary(second)
    same_stores(local, remote)
    again = ingest([str(sources)], remote, engine="ray")
    assert (again.samples, [f.status for f in again.files]) == (0, ["unchanged"] * 4)


def test_a_recipe_on_ray_ingests_and_a_second_run_exits_3(tmp_path, ray_cluster):
    sources = source_folder(tmp_path / "in")
    recipe = from_mapping(
        {"store": {"uri": str(tmp_path / "store"), "engine": "ray"}, "ingest": {"sources": [str(sources)]}}
    )
    run = runner.run(recipe)
    assert run.exit_code == 1, run.to_json()  # 4 of 17 quarantined: above the 5% threshold, as on local
    assert run.step("ingest").summary["samples"] == 13
    store = Store(str(tmp_path / "store"))
    with holding(store.uri, "ingest"):
        with pytest.raises(LockedError) as caught:
            ingest([str(sources)], store, engine="ray")
        assert caught.value.exit_code == 3


def test_an_s3_store_from_ray_workers_with_the_drivers_aws_environment(tmp_path, ray_cluster, s3):  # noqa: F811
    sources = source_folder(tmp_path / "in")
    for path in sorted(sources.iterdir()):
        s3.put(f"in/{path.name}", path.read_bytes())
    local = Store(str(tmp_path / "local"))
    remote = Store(s3.url("warehouse/store"))
    first = ingest([s3.url("in/")], local)
    on_ray = ingest([s3.url("in/")], remote, engine="ray")
    assert ingest_summary(on_ray) == ingest_summary(first) and first.samples == 13
    same_stores(local, remote)
    written = [k for k in s3.keys("warehouse/store/traces/") if k.endswith(".parquet")]
    assert len(written) == 2  # the first run's file from a worker, the second's from the driver's read again
