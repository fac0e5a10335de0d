"""ingest on the Ray engine against the local engine, on the session's two-node cluster on 127.0.0.1
(``ray_cluster``, :mod:`tests.conftest`): the same rows in traces, quarantine and rewards, the same ledger and
resume points, the same summary; the lock still answers exit 3; an ``s3://`` store and sources work from the
workers with the driver's AWS environment."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from prl.errors import LockedError
from prl.ingestion.traces import ingest
from prl.pipeline import runner
from prl.pipeline.recipe import from_mapping
from prl.store.locks import holding
from prl.store.tables import Store
from tests.conftest import write_lines
from tests.delta_log import commit_infos
from tests.records import vllm_chat, vllm_completion
from tests.s3_server import moto_endpoint, s3  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.campaign,  # a Ray cluster: `make test-all`
    pytest.mark.xdist_group("ray"),  # one cluster per session: every Ray test in one xdist worker
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the prl[ray] extra"),
]

NEMO = Path(__file__).parent / "fixtures" / "nemo_gym" / "rollouts.jsonl"
TIMES = {"traces": ["ingested_at"], "quarantine": ["quarantined_at"], "rewards": ["ingested_at"]}


def _chat(k: int, shift: int = 0) -> dict[str, Any]:
    ids = [10 + k + shift, 11 + k, 1]
    return vllm_chat(f"r{k}", [0, 5 + k, 6], [(ids, [-0.25, -0.5, -0.125]), (ids[:2], [-1.0, -2.0])])


def _sources(folder: Path) -> Path:
    """Four files, read on the cluster's two CPUs as two runs (``a``-``b``, ``c``-``d``, by bytes): ``a`` ends in a
    line still being written, ``b`` is gzip with a bad line and a text-only record, ``c`` a NeMo Gym rollout with
    an inline reward; ``d`` repeats a record of ``a`` as it is and another with other tokens, so its run must be
    read again after the first (on the driver)."""
    write_lines(folder / "a.jsonl", [_chat(k) for k in range(4)])
    with open(folder / "a.jsonl", "ab") as fh:
        fh.write(json.dumps(_chat(4)).encode()[:40])  # no newline yet: left for a later run
    text_only = {"id": "t", "object": "chat.completion", "choices": [{"index": 0, "message": {"content": "hi"}}]}
    records = [vllm_completion(f"c{k}", [1, 2], [7, 9 + k], [-0.5, -4.0]) for k in range(3)]
    write_lines(folder / "b.jsonl.gz", [*records, "{not json", text_only], compression="gzip")
    shutil.copy(NEMO, folder / "c.jsonl")
    write_lines(folder / "d.jsonl", [_chat(1), _chat(2, shift=50), vllm_completion("d0", [3], [4, 5], [-1.0, -1.5])])
    return folder


def _table(store: Store, name: str) -> list[dict[str, Any]]:
    rows = store.read(name).drop_columns(TIMES[name]).to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _commits(store: Store, name: str) -> list[dict[str, Any]]:
    infos = commit_infos(store, name)
    return [{k: v for k, v in info.items() if k.startswith("prl.") and k != "prl.commit_id"} for info in infos]


def _summary(result) -> dict[str, Any]:
    out = result.to_json()
    for key in ("seconds", "store", "tokens_per_second"):
        out.pop(key)
    return out


def _same_stores(local: Store, remote: Store) -> None:
    for name in ("traces", "quarantine", "rewards"):
        assert _table(remote, name) == _table(local, name), name
    assert _commits(remote, "traces") == _commits(local, "traces")  # ledger, resume points, command


def test_ingest_on_ray_commits_the_rows_local_does(tmp_path, ray_cluster):
    sources = _sources(tmp_path / "in")
    local, remote = Store(str(tmp_path / "local")), Store(str(tmp_path / "ray"))
    first = ingest([str(sources)], local)
    on_ray = ingest([str(sources)], remote, engine="ray")
    assert (first.samples, first.already_present, first.quarantined) == (
        13,
        2,
        {"malformed_json": 1, "no_token_ids": 1, "duplicate_sample_id": 2},
    )
    assert [f.held_back_bytes for f in first.files][:1] == [40]
    assert _summary(on_ray) == _summary(first)
    _same_stores(local, remote)
    assert len(_table(local, "rewards")) == 1

    with open(sources / "a.jsonl", "ab") as fh:  # the line ends, and one more follows: both runs read on from it
        fh.write(json.dumps(_chat(4)).encode()[40:] + b"\n" + json.dumps(_chat(5)).encode() + b"\n")
    second, second_on_ray = ingest([str(sources)], local), ingest([str(sources)], remote, engine="ray")
    resumed = {Path(f.uri).name: f.resumed_from for f in second.files}
    assert (second.samples, resumed) == (
        4,
        {"a.jsonl": first.files[0].bytes - 40, "b.jsonl.gz": 0, "c.jsonl": 0, "d.jsonl": 0},
    )
    assert _summary(second_on_ray) == _summary(second)
    _same_stores(local, remote)
    again = ingest([str(sources)], remote, engine="ray")
    assert (again.samples, [f.status for f in again.files]) == (0, ["unchanged"] * 4)


def test_a_recipe_on_ray_ingests_and_a_second_run_exits_3(tmp_path, ray_cluster):
    sources = _sources(tmp_path / "in")
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
    sources = _sources(tmp_path / "in")
    for path in sorted(sources.iterdir()):
        s3.put(f"in/{path.name}", path.read_bytes())
    local = Store(str(tmp_path / "local"))
    remote = Store(s3.url("warehouse/store"))
    first = ingest([s3.url("in/")], local)
    on_ray = ingest([s3.url("in/")], remote, engine="ray")
    assert _summary(on_ray) == _summary(first) and first.samples == 13
    _same_stores(local, remote)
    written = [k for k in s3.keys("warehouse/store/traces/") if k.endswith(".parquet")]
    assert len(written) == 2  # the first run's file from a worker, the second's from the driver's read again
