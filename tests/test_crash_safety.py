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

import pytest

from prl.store import Store
from tests.pipeline_helpers import (
    GrowingInput,
    assert_exactly_once,
    assert_shards_sound,
    prl_argv,
    prl_env,
    run_prl,
)

KILLS = 20
SEED = int(os.environ.get("PRL_KILL_SEED", "20261130"))  # other seeds: a longer local soak


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
