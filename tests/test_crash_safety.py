"""Killing ``prl run`` at any instant loses nothing and duplicates nothing (design.md §7).

Real processes: ``prl run`` (ingest → rewards → check-tokens with the DeepSeek-V4 tokenizer → build-shards) is
SIGKILLed at seeded random instants while its input grows between runs, then run to completion. Every input record
must end up exactly once in ``traces`` or ``quarantine``, every sample checked once, every published shard set
complete and verifiable, and no sample shipped twice.

The same test against an ``s3://`` store (moto server) is still to come: it needs the S3 lock and fixture.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from prl.shards import MANIFEST, SAMPLES_FILE
from prl.store import Store
from prl.verify import verify_shards
from tests.pipeline_helpers import GrowingInput, prl_argv, prl_env, run_prl

KILLS = 20
SEED = int(os.environ.get("PRL_KILL_SEED", "20261130"))  # other seeds: a longer local soak


def assert_exactly_once(store: Store, data: GrowingInput) -> None:
    """Every good sample once in traces, every bad record once in quarantine, nothing else in either."""
    traces = pl.read_delta(store.table_uri("traces"), columns=["sample_id"])
    ids = traces["sample_id"].to_list()
    assert len(ids) == len(set(ids)), "a sample is in traces twice"
    assert set(ids) == data.good
    quarantine = pl.read_delta(store.table_uri("quarantine"), columns=["quarantine_id", "source_uri", "source_line"])
    assert quarantine["quarantine_id"].n_unique() == quarantine.height, "a record was quarantined twice"
    assert set(zip(quarantine["source_uri"], quarantine["source_line"])) == data.bad
    assert quarantine.height == len(data.bad)
    rewards = pl.read_delta(store.table_uri("rewards"), columns=["sample_id", "source_line"])
    assert rewards["source_line"].n_unique() == rewards.height, "a reward line was ingested twice"
    assert set(rewards["sample_id"]) == data.good
    if store.version("checks") is not None:
        checks = pl.read_delta(store.table_uri("checks"), columns=["sample_id", "verdict"])
        assert checks["sample_id"].n_unique() == checks.height, "a sample was checked twice"
        assert set(checks["sample_id"]) == data.good and set(checks["verdict"]) == {"ok"}


def assert_shards_sound(out: Path, expect_all: set[str] | None) -> None:
    """Published sets are complete and verifiable; no sample ships twice; staging stays hidden."""
    shipped: list[str] = []
    for name in sorted(os.listdir(out)):
        folder = out / name
        if name.startswith(".") or not folder.is_dir():
            continue  # staging folders of killed builds are dot-folders: never a published set
        assert (folder / MANIFEST).is_file(), f"{name} is visible without a manifest"
        manifest = json.loads((folder / MANIFEST).read_text())
        names = {e["file"] for e in manifest["shards"]} | {SAMPLES_FILE, MANIFEST}
        assert set(os.listdir(folder)) == names, f"{name} holds files its manifest does not name"
        in_shards = []
        for entry in manifest["shards"]:
            in_shards += pq.read_table(folder / entry["file"], columns=["sample_id"])["sample_id"].to_pylist()
        samples = pq.read_table(folder / SAMPLES_FILE)["sample_id"].to_pylist()
        assert sorted(in_shards) == samples
        shipped += samples
    result = verify_shards(str(out)) if shipped else None
    assert result is None or result.ok, result and result.problems
    assert len(shipped) == len(set(shipped)), "a sample shipped in two sets"
    if expect_all is not None:
        assert set(shipped) == expect_all


@pytest.mark.slow
def test_sigkill_at_random_instants_loses_and_duplicates_nothing(tmp_path):
    rng = random.Random(SEED)
    data = GrowingInput(tmp_path / "in", files=3, seed=SEED % 1000, real_text=True)
    store_path, out = tmp_path / "store", tmp_path / "out"
    recipe = str(data.recipe(store_path, out, check=True))  # ingest → rewards → check-tokens → build-shards
    data.grow(40)
    started = time.perf_counter()
    first = run_prl("run", recipe, "--json")
    full = time.perf_counter() - started
    assert first.returncode == 0, first.stderr
    outcomes = {"killed": 0, "finished": 0}
    for _ in range(KILLS):
        data.grow(rng.randint(5, 30))
        proc = subprocess.Popen(
            prl_argv("run", recipe, "--json"), env=prl_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:  # about the first fifth of a run is interpreter start-up: aim most kills past it
            proc.wait(timeout=rng.uniform(0.2 * full, 1.15 * full))
            outcomes["finished"] += 1
            assert proc.returncode == 0
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            outcomes["killed"] += 1
        if rng.random() < 0.3:  # between kills, published state is always sound
            assert_shards_sound(out, None)
    assert outcomes["killed"] >= KILLS // 2, outcomes
    final = run_prl("run", recipe, "--json")
    assert final.returncode == 0, final.stderr
    summary = json.loads(final.stdout)
    assert [s["status"] for s in summary["steps"]] == ["done"] * 4
    store = Store(str(store_path))
    assert_exactly_once(store, data)
    assert_shards_sound(out, data.good)
    again = json.loads(run_prl("run", recipe, "--json").stdout)
    assert again["steps"][0]["summary"]["samples"] == 0
    assert again["steps"][2]["summary"]["checked"] == 0
    assert again["steps"][3]["summary"]["status"] == "nothing_new"
    assert not [p for p in os.listdir(store_path / "_locks") if p.endswith(".lock")]
    assert not [p for p in os.listdir(out) if p.startswith(".staging-")]
