"""Verdicts on genuinely sampled vLLM traffic (tests/fixtures/verdicts, README there), with the tokenizer the
model was served with: every sample ships in a default build, and each note stays visible."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from prl.checks import check_tokens
from prl.ingestion.traces import ingest
from prl.schema import REWARDS
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.store.tables import Store
from tests.checks_helpers import tokenizer_dir
from tests.formats_helpers import FIXTURES

T0 = datetime(2026, 12, 1, tzinfo=UTC)
FILES = [FIXTURES / "verdicts/vllm_cpu_text.jsonl", FIXTURES / "verdicts/vllm_cpu_text_stream.sse"]

EXPECTED = {
    "cmpl-8a3f02dd2e43e3a2#0": ("note", ["roundtrip_boundary"], 5),
    "cmpl-8a3f02dd2e43e3a2#1": ("ok", [], None),
    "cmpl-8a3f02dd2e43e3a2#2": ("ok", [], None),
    "cmpl-a68782c350cecb2b#0": ("ok", [], None),
    "cmpl-a68782c350cecb2b#1": ("ok", [], None),
    "cmpl-bac642af93248d04#0": ("note", ["roundtrip_completion", "special_mid_completion"], 2),
    "cmpl-bac642af93248d04#1": ("ok", [], None),
}
"""(verdict, reasons, first divergence) per sample."""


def reward_every_sample(store: Store) -> None:
    """A reward of 0 or 1 for every traces row, in sample-id order, so that a build has a score for each."""
    ids = sorted(store.read("traces", columns=["sample_id"])["sample_id"].to_pylist())
    rewards = [
        {"sample_id": s, "name": "reward", "value": float(i % 2), "created_at": T0}
        | {"source_uri": "mem://rewards", "source_line": i, "ingested_at": T0}
        for i, s in enumerate(ids)
    ]
    store.commit("rewards", pa.Table.from_pylist(rewards, schema=REWARDS).to_batches())


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    store = Store(str(tmp_path_factory.mktemp("genuine") / "store"))
    result = ingest([str(f) for f in FILES], store)
    assert (result.samples, result.quarantined) == (7, {})
    reward_every_sample(store)
    return store, check_tokens(store, tokenizer_dir())


def test_genuine_samples_are_ok_or_noted(checked):
    store, result = checked
    rows = store.read("checks", columns=["sample_id", "verdict", "reasons", "first_divergence"]).to_pylist()
    assert {r["sample_id"]: (r["verdict"], r["reasons"], r["first_divergence"]) for r in rows} == EXPECTED
    assert result.verdicts == {"ok": 5, "note": 2, "warn": 0, "drift": 0, "invalid": 0}
    assert (result.drift_rate, result.exit_code) == (0.0, 0)


def test_the_boundary_merge_is_skin_after_the_prompt(checked):
    """The prompt "The skin of a whale is" round-trips alone; the sampled "skin" right after " is" re-encodes with
    it as " iss" + "kin"."""
    store, _ = checked
    row = next(r for r in store.read("checks").to_pylist() if r["sample_id"] == "cmpl-8a3f02dd2e43e3a2#0")
    evidence = json.loads(row["detail"])["evidence"]
    assert (evidence["where"], evidence["window_start"]) == ("prompt", 2)
    assert evidence["ids"][2:5] == [[57570, " whale"], [344, " is"], [96861, "skin"]]
    assert evidence["reencoded"][2:5] == [[57570, " whale"], [2602, " iss"], [8705, "kin"]]


def test_a_default_build_ships_every_genuine_sample(checked, tmp_path):
    store, _ = checked
    res = build_shards(store, str(tmp_path / "out"))
    assert (res.rows, res.drops) == (7, {})
    manifest = json.loads(Path(res.manifest_path).read_text())
    assert manifest["check_reasons"] == {
        "roundtrip_boundary": 1,
        "roundtrip_completion": 1,
        "special_mid_completion": 1,
    }
    strict = build_shards(
        store,
        str(tmp_path / "strict"),
        options=ShardOptions(drop_checks=["roundtrip_boundary", "roundtrip_completion"]),
    )
    assert (strict.rows, strict.drops) == (5, {"check_reason": 2})


def test_every_recorded_vllm_sample_ships_with_exact_heads(tmp_path):
    """All 19 recorded vLLM samples (chat, completions, both streams, the logging proxy's capture), checked with the
    model's tokenizer and template and built by default: none is dropped. Chat heads sent in vLLM's sampled-first
    order used to fail ``heads_not_sorted``; read as the exact top k - 1 they pass."""
    store = Store(str(tmp_path / "store"))
    names = ["chat.jsonl", "text.jsonl", "streams.sse", "proxy_capture.jsonl"]
    result = ingest([str(FIXTURES / "vllm_cpu" / n) for n in names], store)
    assert (result.samples, result.quarantined) == (19, {})
    reward_every_sample(store)
    checked = check_tokens(store, tokenizer_dir(), chat_template="deepseek_v4")
    assert checked.verdicts == {"ok": 15, "note": 4, "warn": 0, "drift": 0, "invalid": 0}
    reasons = store.read("checks", columns=["reasons"])["reasons"].to_pylist()
    assert sorted(r for rs in reasons for r in rs) == sorted(
        ["roundtrip_boundary"] + ["roundtrip_completion"] * 3 + ["special_mid_completion"] * 3
    )
    built = build_shards(store, str(tmp_path / "out"))
    assert (built.rows, built.drops) == (19, {})
