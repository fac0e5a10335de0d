"""score-ref on the Ray engine against the local engine, on the session's two-node cluster on 127.0.0.1
(``ray_cluster``, :mod:`tests.conftest`): the same batches, so the same ``ref_logprobs`` rows bit for bit from a
local transformers model, the same quarantine rows and commit metadata; an endpoint's key reaches the workers
from the driver's environment; a usage error a worker meets is the run's exit 2; the lock still answers exit 3."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.errors import LockedError
from prl.ingestion.traces import ingest
from prl.score import score_ref
from prl.store.locks import holding
from prl.store.tables import Store
from tests.delta_log import commit_infos
from tests.score_helpers import Behaviour, Reference, build_tiny_model, score_server, write_traces

pytestmark = [
    pytest.mark.slow,
    pytest.mark.campaign,  # a Ray cluster: `make test-all`
    pytest.mark.xdist_group("ray"),  # one cluster per session: every Ray test in one xdist worker
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the prl[ray] extra"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the prl[ref] extra"),
]
TIMES = {"ref_logprobs": ["ingested_at"], "quarantine": ["quarantined_at"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return folder, Reference(folder)


def _twin_stores(root: Path, vocabs: tuple[int, ...] = (300, 330)) -> tuple[Store, Store, int]:
    """Two stores of the same traces files, one ingest each, over token IDs below ``vocabs`` (past the model's
    300, most samples are refused). Returns the stores and the number of samples."""
    stores = (Store(str(root / "local")), Store(str(root / "ray")))
    samples = 0
    for start, vocab in zip((0, 100, 200), vocabs, strict=False):
        samples += len(write_traces(root / "in", 4, seed=7, vocab=vocab, start=start))
        for store in stores:
            ingest([str(root / "in")], store)
    return *stores, samples


def _table(store: Store, name: str) -> list[dict[str, Any]]:
    rows = store.read(name).drop_columns(TIMES[name]).to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _commits(store: Store) -> list[dict[str, Any]]:
    infos = commit_infos(store, "ref_logprobs")
    return [{k: v for k, v in info.items() if k.startswith("prl.") and k != "prl.commit_id"} for info in infos]


def _summary(result) -> dict[str, Any]:
    out = result.to_json()
    for key in ("seconds", "load_seconds", "tokens_per_second", "store"):
        out.pop(key)
    return out


def test_score_ref_on_ray_writes_the_rows_local_does(tiny, tmp_path, ray_cluster):
    folder, _ = tiny
    local, remote, samples = _twin_stores(tmp_path)
    here = score_ref(local, "tiny", model=str(folder), batch_tokens=48)
    there = score_ref(remote, "tiny", model=str(folder), batch_tokens=48, engine="ray")
    assert (samples, here.candidates, here.batches, here.scored, here.quarantined) == (
        12,
        12,
        8,
        6,
        {"token_out_of_vocab": 6},
    )
    assert _summary(there) == _summary(here)
    assert _table(remote, "ref_logprobs") == _table(local, "ref_logprobs")  # bit for bit: the same batches
    assert _table(remote, "quarantine") == _table(local, "quarantine")
    assert _commits(remote) == _commits(local)
    refused = sum(here.quarantined.values())  # refused samples have no row: every run tries them again
    again = score_ref(remote, "tiny", model=str(folder), batch_tokens=48, engine="ray")
    assert (again.candidates, again.scored, again.quarantined) == (refused, 0, here.quarantined)
    assert _table(remote, "quarantine") == _table(local, "quarantine")  # their quarantine rows are not repeated


def test_an_endpoint_key_reaches_the_workers_and_a_second_run_exits_3(tiny, tmp_path, monkeypatch, ray_cluster):
    _, ref = tiny
    local, remote, samples = _twin_stores(tmp_path, (300, 300))
    secret = "sk-test-ray-51d2"
    monkeypatch.setenv("PRL_REF_API_KEY", secret)
    with score_server(ref, Behaviour(api_key=secret)) as (url, seen):
        here = score_ref(local, "tiny", endpoint=url, batch_tokens=64)
        args = ["score-ref", "--store", remote.uri, "--ref-model", "tiny", "--endpoint", url, "--batch-tokens", "64"]
        cli = CliRunner().invoke(app, [*args, "--engine", "ray", "--json"])
    assert cli.exit_code == here.exit_code, cli.output
    assert json.loads(cli.stdout)["scored"] == here.scored == samples
    assert {h["authorization"] for h in seen.headers} == {f"Bearer {secret}"}
    assert secret not in cli.output
    assert _table(remote, "ref_logprobs") == _table(local, "ref_logprobs")
    with holding(remote.uri, "score-ref"):
        with pytest.raises(LockedError) as caught:
            score_ref(remote, "other", endpoint=url, engine="ray")
        assert caught.value.exit_code == 3
    bad_args = ["score-ref", "--store", remote.uri, "--ref-model", "other", "--endpoint", url, "--concurrency", "0"]
    bad = CliRunner().invoke(app, [*bad_args, "--engine", "ray", "--json"])  # refused by the workers' backend
    assert bad.exit_code == 2 and "--concurrency" in json.loads(bad.stdout)["error"]
