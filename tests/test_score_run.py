"""``prl score-ref`` over a store: every backend writes the same reference logprobs, only missing samples are
scored, bad answers are quarantined, endpoint faults are retried or end the run with exit 5, and a rerun after a
partial run finishes the rest without duplicates."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.dataset as ds
import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.ingestion.traces import ingest
from prl.score import score_ref
from prl.store.tables import Store
from tests.score_helpers import Behaviour, Reference, build_tiny_model, score_server, traces_store, write_traces

pytest.importorskip("torch")
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return folder, Reference(folder)


@pytest.fixture
def filled(tmp_path):
    return traces_store(tmp_path, 12, seed=3)


def _refs(store: Store, ref_model: str | None = None) -> dict[str, list[float]]:
    where = ds.field("ref_model") == ref_model if ref_model else None
    table = store.read("ref_logprobs", columns=["sample_id", "ref_logprobs"], filter=where)
    ids = table.column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)), "a sample was scored twice"
    return dict(zip(ids, table.column("ref_logprobs").to_pylist(), strict=True))


def _quarantine(store: Store) -> list[tuple[str, str]]:
    table = store.read("quarantine", filter=ds.field("table") == "ref_logprobs")
    return sorted(zip(table.column("sample_id").to_pylist(), table.column("reason").to_pylist(), strict=True))


def _assert_matches_reference(refs, samples, ref: Reference) -> None:
    assert set(refs) == set(samples)
    for sample_id, (prompt, completion) in samples.items():
        np.testing.assert_allclose(refs[sample_id], ref.completion(prompt, completion), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["local", "vllm", "sglang"])
def test_every_backend_writes_the_models_logprobs(tiny, filled, kind):
    folder, ref = tiny
    store, samples = filled
    with score_server(ref) as (url, seen):
        args = (
            {"model": str(folder)} if kind == "local" else {"endpoint": url + ("/generate" if kind == "sglang" else "")}
        )
        result = score_ref(store, "tiny", batch_tokens=128, concurrency=3, **args)
    assert result.exit_code == 0 and result.backend == kind
    assert result.candidates == result.scored == len(samples) and result.batches > 1
    assert result.completion_tokens == sum(len(c) for _, c in samples.values())
    _assert_matches_reference(_refs(store, "tiny"), samples, ref)
    if kind != "local":  # token IDs went out, never text
        assert len(seen.bodies) == len(samples)
        key = "prompt" if kind == "vllm" else "input_ids"
        sent = sorted(tuple(b[key]) for b in seen.bodies)
        assert sent == sorted(tuple(p + c) for p, c in samples.values())
        assert all(
            set(b)
            <= {
                "prompt",
                "input_ids",
                "max_tokens",
                "temperature",
                "prompt_logprobs",
                "sampling_params",
                "return_logprob",
                "logprob_start_len",
                "top_logprobs_num",
            }
            for b in seen.bodies
        )


def test_only_missing_samples_are_scored(tiny, tmp_path):
    folder, ref = tiny
    store, samples = traces_store(tmp_path, 6, seed=4)
    first = score_ref(store, "tiny", model=str(folder))
    assert first.scored == len(samples)
    again = score_ref(store, "tiny", model=str(tmp_path / "no-model"))  # nothing missing: no model is loaded
    assert (again.candidates, again.scored, again.batches) == (0, 0, 0)
    more = write_traces(tmp_path / "in", 3, seed=4, start=100)
    ingest([str(tmp_path / "in")], store)
    third = score_ref(store, "tiny", model=str(folder))
    assert third.scored == len(more)
    _assert_matches_reference(_refs(store, "tiny"), {**samples, **more}, ref)
    other = score_ref(store, "other-ref", model=str(folder))  # another ref_model scores everything again
    assert other.scored == len(samples) + len(more)


def test_dry_run_counts_and_writes_nothing(tiny, filled):
    folder, _ = tiny
    store, samples = filled
    result = score_ref(store, "tiny", model=str(folder), dry_run=True)
    assert result.candidates == len(samples) and result.scored == 0
    assert result.input_tokens == sum(len(p) + len(c) for p, c in samples.values())
    assert store.version("ref_logprobs") is None


def test_misaligned_answers_are_quarantined_never_written(tiny, filled):
    _, ref = tiny
    store, samples = filled
    with score_server(ref, Behaviour(shift=True)) as (url, _):
        result = score_ref(store, "tiny", endpoint=url + "/generate")
    assert result.scored == 0 and result.quarantined == {"misaligned": len(samples)}
    assert result.exit_code == 1
    assert _refs(store) == {}
    assert _quarantine(store) == sorted((s, "misaligned") for s in samples)
    with score_server(ref, Behaviour(shift=True)) as (url, _):
        score_ref(store, "tiny", endpoint=url + "/generate")  # tried again; quarantined once only
    assert len(_quarantine(store)) == len(samples)


def test_rejected_request_is_quarantined(tiny, filled):
    _, ref = tiny
    store, samples = filled
    with score_server(ref, Behaviour(statuses=[400])) as (url, _):
        result = score_ref(store, "tiny", endpoint=url, concurrency=1)
    assert result.quarantined == {"endpoint_rejected": 1} and result.scored == len(samples) - 1


def test_429_then_ok_is_retried(tiny, filled):
    _, ref = tiny
    store, samples = filled
    with score_server(ref, Behaviour(statuses=[429, 503])) as (url, seen):
        result = score_ref(store, "tiny", endpoint=url, concurrency=1)
    assert result.exit_code == 0 and result.scored == len(samples)
    assert len(seen.bodies) == len(samples) + 2
    _assert_matches_reference(_refs(store), samples, ref)


def test_endpoint_down_exits_5_and_a_rerun_finishes_without_duplicates(tiny, filled):
    _, ref = tiny
    store, samples = filled
    with score_server(ref, Behaviour(ok_budget=5)) as (url, _):
        code, summary = _cli(store, url, "--concurrency", "1", "--retries", "1", "--batch-tokens", "40")
    assert code == 5 and "unavailable" in summary["error"]
    partial = _refs(store)
    assert 0 < len(partial) <= 5  # the batches committed before the endpoint went down stay
    with score_server(ref) as (url, seen):
        code, summary = _cli(store, url, "--batch-tokens", "40")
    assert code == 0 and summary["scored"] == len(samples) - len(partial)
    assert len(seen.bodies) == len(samples) - len(partial)
    _assert_matches_reference(_refs(store), samples, ref)


def test_always_500_exits_5(tiny, filled):
    _, ref = tiny
    store, _ = filled
    with score_server(ref, Behaviour(fail_always=True)) as (url, seen):
        code, summary = _cli(store, url, "--retries", "2", "--concurrency", "1")
    assert code == 5 and "HTTP 500 after 3 attempts" in summary["error"]
    assert len(seen.bodies) == 3 and _refs(store) == {}


def test_endpoint_that_refuses_connections_exits_5(filled):
    store, _ = filled
    code, summary = _cli(store, "http://127.0.0.1:9", "--retries", "1")
    assert code == 5 and "ConnectError" in summary["error"]


def test_bearer_token_comes_from_the_environment_and_is_never_printed(tiny, filled, monkeypatch):
    _, ref = tiny
    store, samples = filled
    secret = "sk-test-7f3a9c"
    with score_server(ref, Behaviour(api_key=secret)) as (url, seen):
        monkeypatch.delenv("PRL_REF_API_KEY", raising=False)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        res = runner.invoke(app, ["score-ref", "--store", store.uri, "--ref-model", "tiny", "--endpoint", url])
        assert res.exit_code == 2 and "401" in res.output
        monkeypatch.setenv("PRL_REF_API_KEY", secret)
        res = runner.invoke(
            app, ["score-ref", "--store", store.uri, "--ref-model", "tiny", "--endpoint", url, "--json"]
        )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["scored"] == len(samples)
    assert seen.headers[-1]["authorization"] == f"Bearer {secret}"
    assert secret not in res.output and secret not in json.dumps(_quarantine(store))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "exactly one of --endpoint"),
        (["--endpoint", "http://x", "--model", "m"], "exactly one of --endpoint"),
        (["--endpoint", "ftp://x"], "http:// or https://"),
        (["--endpoint", "http://x", "--backend", "tgi"], "--backend must be"),
        (["--model", "m", "--backend", "vllm"], "needs --endpoint"),
        (["--endpoint", "http://x", "--concurrency", "0"], "--concurrency"),
        (["--model", "m", "--batch-tokens", "0"], "--batch-tokens"),
    ],
)
def test_usage_errors_exit_2(filled, args, message):
    store, _ = filled
    res = runner.invoke(app, ["score-ref", "--store", store.uri, "--ref-model", "tiny", *args, "--json"])
    assert res.exit_code == 2 and message in json.loads(res.stdout.strip().splitlines()[-1])["error"]


def _cli(store: Store, url: str, *extra: str) -> tuple[int, dict]:
    res = runner.invoke(
        app, ["score-ref", "--store", store.uri, "--ref-model", "tiny", "--endpoint", url, *extra, "--json"]
    )
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.output
    return res.exit_code, json.loads(lines[0])
