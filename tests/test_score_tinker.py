"""``prl score-ref --backend tinker`` through the real ``tinker`` SDK against a Tinker-speaking test server
(:mod:`tests.tinker_server`): the rows are the tiny model's logprobs, the SDK's future polling and retries run,
service faults end the run with exit 5, the key stays the SDK's, and bad answers are quarantined."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.formats.base import Quarantined
from prl.pipeline.runner import run
from prl.score import score_ref
from prl.score.base import ScoreRequest
from prl.score.tinker import check_answer
from prl.store.tables import Store
from tests.pipeline_helpers import write_recipe
from tests.score_helpers import Reference, build_tiny_model, traces_store, write_traces
from tests.test_score_run import _assert_matches_reference, _quarantine, _refs
from tests.tinker_server import API_KEY, BASE_MODEL, TinkerBehaviour, tinker_server

pytest.importorskip("torch")
pytest.importorskip("tinker")
runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures" / "score"
CHECKPOINT = "tinker://run-1/sampler_weights/000100"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return folder, Reference(folder)


@pytest.fixture
def filled(tmp_path):
    return traces_store(tmp_path, 8, seed=5)


@pytest.fixture(autouse=True)
def credentials(tmp_path, monkeypatch):
    """The SDK's key from TINKER_API_KEY only: no stored credentials, no credential command, no telemetry."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINKER_CREDENTIAL_CMD", raising=False)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)


def _tinker(store: Store, url: str, **options):
    options.setdefault("served_model", BASE_MODEL)
    return score_ref(store, "tiny", endpoint=url, backend="tinker", **options)


def _cli(store: Store, url: str, *extra: str) -> tuple[int, dict, str]:
    args = ["score-ref", "--store", store.uri, "--ref-model", "tiny", "--endpoint", url, "--backend", "tinker"]
    res = runner.invoke(app, [*args, "--served-model", BASE_MODEL, *extra, "--json"])
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.output
    return res.exit_code, json.loads(lines[0]), res.output


def test_tinker_backend_writes_the_models_logprobs(tiny, filled, monkeypatch):
    _, ref = tiny
    store, samples = filled
    monkeypatch.setenv("TINKER_TELEMETRY", "1")  # the SDK's default: its batches go to the service too
    with tinker_server(ref) as (url, seen):
        result = _tinker(store, url, batch_tokens=128, concurrency=3)
    assert result.exit_code == 0 and result.backend == "tinker" and result.source == url
    assert result.candidates == result.scored == len(samples) and result.batches > 1
    _assert_matches_reference(_refs(store, "tiny"), samples, ref)
    sessions = seen.bodies("/api/v1/create_sampling_session")
    assert sessions == [
        {
            "session_id": "session-1",
            "sampling_session_seq_id": 0,
            "base_model": BASE_MODEL,
            "type": "create_sampling_session",
        }
    ]
    asked = seen.bodies("/api/v1/asample")
    assert len(asked) == len(samples)  # one request per sample: token IDs out, the completion scored
    sent = sorted((tuple(b["prompt"]["chunks"][0]["tokens"]), b["prompt_logprobs_last_n"]) for b in asked)
    assert sent == sorted((tuple(p + c), len(c)) for p, c in samples.values())
    assert all(b["prompt_logprobs"] is True and b["sampling_params"]["max_tokens"] == 1 for b in asked)
    assert seen.bodies("/api/v1/sessions/session-1/finish") == [{"reason": {"type": "success"}, "detail": None}]
    assert "SESSION_START" in [e["event"] for b in seen.bodies("/api/v1/telemetry") for e in b["events"]]


def test_the_asample_body_is_the_recorded_one(tiny, tmp_path):
    """What the SDK sends for one sample, field by field (tests/fixtures/score/README.md)."""
    _, ref = tiny
    store, samples = traces_store(tmp_path, 1, seed=9)  # one record, two choices: two requests, sent concurrently
    assert len(samples) == 2
    with tinker_server(ref) as (url, seen):
        _tinker(store, url)
    recorded = json.loads((FIXTURES / "tinker_asample_request.json").read_text())
    bodies = seen.bodies("/api/v1/asample")
    # each attempt takes the SDK's next request id: on a loaded machine an attempt that went nowhere before prl's
    # retry leaves the first id unseen, so the id is checked apart from the rest of the body
    seq_ids = [body.pop("seq_id") for body in bodies]
    recorded.pop("seq_id")
    expected = []
    for prompt, completion in samples.values():
        body = json.loads(json.dumps(recorded))
        body["prompt"]["chunks"][0]["tokens"] = prompt + completion
        body["prompt_logprobs_last_n"] = len(completion)
        expected.append(body)
    # the two requests may arrive in either order, and an attempt that reached the server before a retry is seen twice
    assert sorted({json.dumps(b, sort_keys=True) for b in bodies}) == sorted(
        json.dumps(b, sort_keys=True) for b in expected
    )
    assert len(set(seq_ids)) == len(seq_ids) and all(isinstance(i, int) and i >= 0 for i in seq_ids)
    polls = [headers for _, path, headers, _ in seen.requests if path == "/api/v1/retrieve_future"]
    assert polls  # every retrieve_future poll asks for the protobuf answer
    assert all({k.lower(): v for k, v in h.items()}["accept"] == "application/x-protobuf" for h in polls)


def test_a_checkpoint_path_and_the_future_polling(tiny, filled):
    _, ref = tiny
    store, samples = filled
    with tinker_server(ref, TinkerBehaviour(try_again=2)) as (url, seen):
        result = _tinker(store, url, served_model=CHECKPOINT, concurrency=2)
    assert result.scored == len(samples)
    _assert_matches_reference(_refs(store), samples, ref)
    assert seen.bodies("/api/v1/create_sampling_session")[0]["model_path"] == CHECKPOINT
    assert [p for m, p, _, _ in seen.requests if m == "GET"] == [
        "/api/v1/healthz",
        f"/api/v1/samplers/sampler-0|{CHECKPOINT}",
    ]
    polls = seen.bodies("/api/v1/retrieve_future")
    assert len(polls) == 3 * len(samples)  # two "try again" answers, then the result, per request
    assert sorted(set(seen.polls.values())) == [3]


def test_service_errors_are_retried(tiny, filled):
    _, ref = tiny
    store, samples = filled
    behaviour = TinkerBehaviour(asample_statuses=[503], failed=["server"])
    with tinker_server(ref, behaviour) as (url, seen):
        result = _tinker(store, url, concurrency=1)
    assert result.exit_code == 0 and result.scored == len(samples)
    # the SDK retries the 503 itself; prl sends again the request the service failed on its side
    assert len(seen.bodies("/api/v1/asample")) == len(samples) + 2
    _assert_matches_reference(_refs(store), samples, ref)


def test_a_request_failed_as_the_callers_fault_is_quarantined(tiny, filled):
    _, ref = tiny
    store, samples = filled
    with tinker_server(ref, TinkerBehaviour(failed=["user"])) as (url, _):
        result = _tinker(store, url, concurrency=1)
    assert result.quarantined == {"endpoint_rejected": 1} and result.scored == len(samples) - 1


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [({"shift": True}, "misaligned"), ({"drop": True}, "length_mismatch"), ({"json_answer": True}, "bad_response")],
)
def test_bad_answers_are_quarantined_never_written(tiny, filled, behaviour, reason):
    _, ref = tiny
    store, samples = filled
    with tinker_server(ref, TinkerBehaviour(**behaviour)) as (url, _):
        result = _tinker(store, url)
    assert result.scored == 0 and result.quarantined == {reason: len(samples)} and result.exit_code == 1
    assert _refs(store) == {}
    assert _quarantine(store) == sorted((s, reason) for s in samples)


@pytest.mark.campaign  # waits out the SDK's retries: `make test-all`
def test_service_down_exits_5_and_a_rerun_finishes_without_duplicates(tiny, filled):
    _, ref = tiny
    store, samples = filled
    with tinker_server(ref, TinkerBehaviour(ok_budget=3)) as (url, seen):
        code, summary, _ = _cli(
            store, url, "--concurrency", "1", "--retries", "1", "--timeout", "4", "--batch-tokens", "40"
        )  # 4 s: opening the session and the good answers must fit in it on a loaded machine too
    assert code == 5 and "is unavailable: no answer in 4s after 2 attempts" in summary["error"]
    assert {b["reason"]["type"] for b in seen.bodies("/api/v1/sessions/session-1/finish")} == {"errored"}
    partial = _refs(store)
    assert 0 < len(partial) <= 3
    with tinker_server(ref) as (url, seen):
        code, summary, _ = _cli(store, url, "--batch-tokens", "40")
    assert code == 0 and summary["scored"] == len(samples) - len(partial)
    assert len(seen.bodies("/api/v1/asample")) == len(samples) - len(partial)
    _assert_matches_reference(_refs(store), samples, ref)


def test_service_that_refuses_connections_exits_5(filled):
    store, _ = filled
    code, summary, _ = _cli(store, "http://127.0.0.1:9", "--retries", "1")
    assert code == 5 and "ConnectError after 2 attempts" in summary["error"]


def test_the_key_is_the_sdks_and_never_printed(tiny, filled, monkeypatch):
    _, ref = tiny
    store, samples = filled
    with tinker_server(ref) as (url, seen):
        monkeypatch.delenv("TINKER_API_KEY")
        code, summary, _ = _cli(store, url)
        assert code == 2 and "TINKER_API_KEY" in summary["error"]
        monkeypatch.setenv("TINKER_API_KEY", "tml-wrong-key")
        code, summary, output = _cli(store, url)
        assert code == 2 and "401" in summary["error"] and "tml-wrong-key" not in output
        monkeypatch.setenv("TINKER_API_KEY", API_KEY)
        code, summary, output = _cli(store, url)
    assert code == 0 and summary["scored"] == len(samples)
    assert {h.get("x-api-key") or h.get("X-API-Key") for _, _, h, _ in seen.requests[-3:]} == {API_KEY}
    assert API_KEY not in output and API_KEY not in json.dumps(_quarantine(store))


def test_a_recipe_scores_with_tinker(tiny, tmp_path):
    _, ref = tiny
    samples = write_traces(tmp_path / "in", 4, seed=7)
    with tinker_server(ref) as (url, _):
        table = {"ref_model": "tiny", "endpoint": url, "backend": "tinker", "served_model": CHECKPOINT}
        recipe = write_recipe(
            tmp_path / "recipe.toml", {"store": {"uri": "store"}, "ingest": {"sources": ["in"]}, "score_ref": table}
        )
        result = run(str(recipe))
    assert result.exit_code == 0, result.to_json()
    assert result.step("score_ref").summary["scored"] == len(samples)
    _assert_matches_reference(_refs(Store(str(tmp_path / "store"))), samples, ref)


def test_tinker_needs_a_served_model(filled):
    store, _ = filled
    res = runner.invoke(
        app,
        [
            "score-ref",
            "--store",
            store.uri,
            "--ref-model",
            "t",
            "--endpoint",
            "http://x",
            "--backend",
            "tinker",
            "--json",
        ],
    )
    assert res.exit_code == 2 and "needs --served-model" in json.loads(res.stdout.strip().splitlines()[-1])["error"]


def _request(prompt: int, completion: int) -> ScoreRequest:
    return ScoreRequest("s", np.arange(2, 2 + prompt, dtype=np.int32), np.arange(9, 9 + completion, dtype=np.int32))


def test_check_answer_takes_the_completion_positions():
    request = _request(3, 2)
    np.testing.assert_array_equal(check_answer([None, None, None, -0.5, -0.25], request), np.float32([-0.5, -0.25]))
    cases = [
        ([None, None, None, -0.5], "length_mismatch"),
        ([None, None, -1.5, -0.5, -0.25], "misaligned"),
        ([None, None, None, -0.5, None], "nonfinite_logprob"),
        ([None, None, None, -0.5, float("nan")], "nonfinite_logprob"),
        ([None, None, None, 0.5, -0.25], "positive_logprob"),
        ([None, None, None, "x", -0.25], "bad_response"),
        ({"logprobs": []}, "bad_response"),
    ]
    for values, reason in cases:
        outcome = check_answer(values, request)
        assert isinstance(outcome, Quarantined) and outcome.reason == reason, (values, outcome)
