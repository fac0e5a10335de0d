"""Every command's exit codes (docs/design.md) through the CLI, each with its one-line ``--json`` summary.

0 done · 1 data problems past a threshold · 2 usage / configuration / unknown format / a path that is no store ·
3 locked · 5 retryable I/O (permission denied, read-only filesystem) · 130 interrupted.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.shards.target import LocalOut
from prl.store.locks import lock_for
from tests.pipeline_helpers import GrowingInput, invoke_json, write_recipe

runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A store with traces and rewards and one shard set, built once for the read-only cases."""
    root = tmp_path_factory.mktemp("built")
    data = GrowingInput(root / "in", files=1, seed=11)
    data.grow(10)
    recipe = data.recipe(root / "store", root / "out")
    res = runner.invoke(app, ["run", str(recipe), "--json"])
    assert res.exit_code == 0, res.output
    set_dir = json.loads(res.stdout)["steps"][2]["summary"]["set_dir"]
    return {"root": root, "data": data, "recipe": str(recipe), "set_dir": set_dir}


def fresh(tmp_path: Path, records: int = 10, bad_every: int = 1000, seed: int = 5) -> GrowingInput:
    data = GrowingInput(tmp_path / "in", files=1, seed=seed, bad_every=bad_every)
    data.grow(records)
    return data


# --- ingest ------------------------------------------------------------------------------------------------
def test_ingest_codes(tmp_path, monkeypatch):
    clean = fresh(tmp_path / "a", records=40)  # one malformed line in 41: 2.4 % < 5 %
    store = str(tmp_path / "store")
    code, summary = invoke_json(["ingest", str(clean.root / "traces"), "--store", store])
    assert (code, summary["samples"], summary["quarantined_total"]) == (0, len(clean.good), 1)
    assert invoke_json(["ingest", str(clean.root / "traces"), "--store", store])[0] == 0  # nothing new is 0 too

    dirty = fresh(tmp_path / "b", records=6, bad_every=2, seed=6)  # 3 length mismatches + 1 malformed line
    code, summary = invoke_json(["ingest", str(dirty.root / "traces"), "--store", store])
    assert code == 1 and summary["quarantined"] == {"length_mismatch": 3, "malformed_json": 1}

    unknown = tmp_path / "odd.jsonl"
    unknown.write_text('{"hello": "world"}\n')
    code, summary = invoke_json(["ingest", str(unknown), "--store", store])
    assert code == 1 and summary["quarantined"] == {"unknown_format": 1}  # a record of no known format
    assert invoke_json(["ingest", str(unknown), "--store", store, "--format", "csv-ish"])[0] == 2
    assert invoke_json(["ingest", str(unknown), "--store", store, "--kind", "labels"])[0] == 2

    lock = lock_for(store, "ingest")
    lock.acquire()
    try:
        code, summary = invoke_json(["ingest", str(dirty.root / "traces"), "--store", store])
    finally:
        lock.release()
    assert code == 3 and f":{os.getpid()}" in summary["error"]

    (tmp_path / "file-store").write_text("")
    code, summary = invoke_json(["ingest", str(clean.root / "traces"), "--store", str(tmp_path / "file-store")])
    assert code == 2 and "is not a prl store: it is a file" in summary["error"]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("prl.ingestion.traces.ingest", interrupted)
    assert invoke_json(["ingest", str(clean.root / "traces"), "--store", store]) == (
        130,
        {"command": "ingest", "error": "interrupted", "exit_code": 130},
    )


def test_ingest_permission_denied_is_retryable(tmp_path, monkeypatch):
    clean = fresh(tmp_path)

    def denied(fd, operation):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fcntl, "flock", denied)  # the lock cannot be taken
    code, summary = invoke_json(["ingest", str(clean.root / "traces"), "--store", str(tmp_path / "store")])
    assert code == 5 and "Permission denied" in summary["error"]


def test_side_table_ingest_codes(tmp_path):
    store = str(tmp_path / "store")
    good = tmp_path / "rewards.jsonl"
    good.write_text("".join(json.dumps({"sample_id": f"s{i}", "reward": i}) + "\n" for i in range(20)))
    assert invoke_json(["ingest", "--kind", "rewards", str(good), "--store", store])[0] == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"sample_id": "x", "reward": "high"}\n{"reward": 1}\n{"sample_id": "y", "reward": 1}\n')
    code, summary = invoke_json(["ingest", "--kind", "rewards", str(bad), "--store", store])
    assert code == 1 and summary["quarantined"] == {"bad_value": 1, "missing_key": 1}
    lock = lock_for(store, "ingest-ref_logprobs")
    lock.acquire()
    try:
        assert invoke_json(["ingest", "--kind", "ref", str(good), "--store", store])[0] == 3
    finally:
        lock.release()
    (tmp_path / "file-store").write_text("")
    assert invoke_json(["ingest", "--kind", "rewards", str(good), "--store", str(tmp_path / "file-store")])[0] == 2


# --- build-shards, export ----------------------------------------------------------------------------------
def test_build_shards_codes(tmp_path):
    data = fresh(tmp_path)
    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    runner.invoke(app, ["run", str(data.recipe(tmp_path / "store", tmp_path / "out")), "--only", "ingest"])
    runner.invoke(app, ["run", str(data.recipe(tmp_path / "store", tmp_path / "out")), "--only", "rewards"])
    base = ["build-shards", "--store", store, "--out", out]
    code, summary = invoke_json([*base, "--set", "max_drop_rate=0.5"])  # no token checks: every sample unchecked
    assert code == 1 and summary["drops"] == {"unchecked": len(data.good)}
    assert invoke_json([*base, "--set", "require_checks=false", "--dry-run"])[0] == 0
    assert not os.path.exists(out) or not [n for n in os.listdir(out) if not n.startswith((".", "_"))]
    assert invoke_json([*base, "--set", "advantage=median"])[0] == 2
    lock = lock_for(store, LocalOut(out).lock_step())
    lock.acquire()
    try:
        code, summary = invoke_json([*base, "--set", "require_checks=false"])
    finally:
        lock.release()
    assert code == 3 and "build-shards" in summary["error"]
    code, summary = invoke_json([*base, "--set", "require_checks=false"])
    assert (code, summary["rows"]) == (0, len(data.good))
    (tmp_path / "file-store").write_text("")
    assert invoke_json(["build-shards", "--store", str(tmp_path / "file-store"), "--out", out])[0] == 2


def test_export_codes(built, tmp_path):
    code, summary = invoke_json(["export", built["set_dir"], str(tmp_path / "d.jsonl")])
    assert (code, summary["rows"]) == (0, len(built["data"].good))
    assert invoke_json(["export", built["set_dir"], str(tmp_path / "d.jsonl"), "--format", "hf"])[0] == 2


# --- run, inspect, verify ----------------------------------------------------------------------------------
def test_run_codes(built, tmp_path):
    code, summary = invoke_json(["run", built["recipe"]])
    assert code == 0 and summary["steps"][0]["summary"]["samples"] == 0
    dirty = fresh(tmp_path, records=3, seed=7)  # one malformed line in 4 records
    strict = write_recipe(
        tmp_path / "strict.toml",
        {"store": {"uri": "store"}, "ingest": {"sources": "in/traces", "max_quarantine_rate": 0.0}},
    )
    code, summary = invoke_json(["run", str(strict), "--dry-run"])
    assert len(dirty.bad) == 1
    assert code == 1 and summary["steps"][0]["summary"]["quarantine_rate"] == round(1 / (len(dirty.good) + 1), 6)
    assert invoke_json(["run", str(tmp_path / "missing.toml")])[0] == 2


def test_inspect_codes(built, tmp_path):
    code, summary = invoke_json(["inspect", str(built["root"] / "store")])
    assert (code, summary["kind"]) == (0, "store")
    code, summary = invoke_json(["inspect", str(built["root"] / "out")])
    assert (code, summary["kind"]) == (0, "shards")
    assert invoke_json(["inspect", str(tmp_path / "nowhere")])[0] == 2
    (tmp_path / "f").write_text("x")
    assert invoke_json(["inspect", str(tmp_path / "f")])[0] == 2


def test_verify_codes(built, tmp_path):
    code, summary = invoke_json(["verify", built["set_dir"]])
    assert (code, summary["ok"], summary["rows"]) == (0, True, len(built["data"].good))
    assert invoke_json(["verify", str(tmp_path)])[0] == 2


# --- check-tokens ------------------------------------------------------------------------------------------
def test_check_tokens_codes(built, tmp_path, tokenizer_dir, monkeypatch):
    store = str(tmp_path / "store")
    data = fresh(tmp_path, records=6, seed=9)
    assert invoke_json(["ingest", str(data.root / "traces"), "--store", store])[0] == 1  # 1 malformed line in 7
    base = ["check-tokens", "--store", store, "--tokenizer", tokenizer_dir]
    code, summary = invoke_json([*base, "--max-drift-rate", "0", "--dry-run"])  # random IDs do not round-trip
    assert code == 1 and summary["checked"] == len(data.good) and summary["drift_rate"] > 0
    lock = lock_for(store, "check-tokens")
    lock.acquire()
    try:
        code, summary = invoke_json(base)
    finally:
        lock.release()
    assert code == 3 and "check-tokens" in summary["error"]
    code, summary = invoke_json(base)
    assert (code, summary["checked"]) == (0, len(data.good))
    assert invoke_json(["check-tokens", "--store", store, "--tokenizer", str(tmp_path / "no-tokenizer")])[0] == 2
    (tmp_path / "file-store").write_text("")
    assert invoke_json(["check-tokens", "--store", str(tmp_path / "file-store"), "--tokenizer", tokenizer_dir])[0] == 2

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("prl.checks.check_tokens", interrupted)
    assert invoke_json(base)[0] == 130
