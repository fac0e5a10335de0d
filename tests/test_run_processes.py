"""``prl run`` as real processes: a concurrent second run exits 3 at once naming the holder; SIGTERM exits 130
and keeps committed work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from prl.store.tables import Store
from tests.pipeline_helpers import (
    GrowingInput,
    assert_exactly_once,
    assert_shards_sound,
    prl_argv,
    prl_env,
    run_prl,
)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Poll until ``path`` exists (a glob pattern in its last part is allowed) while ``proc`` runs."""
    deadline = time.monotonic() + timeout
    while not list(path.parent.glob(path.name)):
        assert proc.poll() is None, f"run ended (exit {proc.returncode}) before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


@pytest.fixture
def big(tmp_path):
    data = GrowingInput(tmp_path / "in", files=4, seed=21)
    data.grow(1500)  # a run of a few seconds: ingest about 1 s, 3,000 samples into ~200 shards
    return data, str(data.recipe(tmp_path / "store", tmp_path / "out"))


@pytest.mark.slow
def test_second_concurrent_run_exits_3_at_once_naming_the_holder(tmp_path, big):
    data, recipe = big
    first = subprocess.Popen(prl_argv("run", recipe, "--json"), env=prl_env(), stdout=subprocess.PIPE, text=True)
    wait_for(tmp_path / "store" / "_locks" / "run.lock", first)
    started = time.perf_counter()
    second = run_prl("run", recipe, "--json")
    waited = time.perf_counter() - started
    still_running = first.poll() is None
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0
    assert second.returncode == 3, second.stderr
    summary = json.loads(second.stdout)
    assert summary["exit_code"] == 3 and summary["steps"] == []
    assert f":{first.pid} " in summary["error"] and "run lock" in summary["error"]
    assert still_running and waited < 10
    assert json.loads(out)["steps"][0]["summary"]["samples"] == len(data.good)
    assert_exactly_once(Store(str(tmp_path / "store")), data)


@pytest.mark.slow
def test_sigterm_exits_130_keeps_committed_steps_and_a_rerun_completes(tmp_path, big):
    data, recipe = big
    proc = subprocess.Popen(prl_argv("run", recipe, "--json"), env=prl_env(), stdout=subprocess.PIPE, text=True)
    wait_for(tmp_path / "store" / "_locks" / "build-shards-*.lock", proc)  # ingest and rewards are committed
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    summary = json.loads(out)
    assert summary["exit_code"] == 130
    assert [s["status"] for s in summary["steps"]] == ["done", "done", "interrupted"]
    assert pl.read_delta(str(tmp_path / "store" / "traces")).height == len(data.good)
    held = [n for n in os.listdir(tmp_path / "store" / "_locks") if not n.endswith(".guard")]
    assert held == []  # an interrupted run releases its locks
    published = os.listdir(tmp_path / "out") if (tmp_path / "out").exists() else []
    assert published == []  # the interrupted build removed its staging folder; nothing half-built is visible
    rerun = run_prl("run", recipe, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["steps"][2]["summary"]["rows"] == len(data.good)
    assert_exactly_once(Store(str(tmp_path / "store")), data)
    assert_shards_sound(tmp_path / "out", data.good)
