"""Killing ``prl run`` at any instant loses nothing and duplicates nothing (docs/design.md).

Real processes: ``prl run`` (ingest → rewards → check-tokens with the DeepSeek-V4 tokenizer → build-shards) is
SIGKILLed at seeded random instants while its input grows between runs, then run to completion. Every input record
must end up exactly once in ``traces`` or ``quarantine``, every sample checked once, every published shard set
complete and verifiable, and no sample shipped twice.

The S3 variant runs the same loop against an ``s3://`` store on a moto server (shards stay local).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from prl.shards.layout import meta_root
from prl.store.tables import Store
from tests.pipeline_helpers import (
    GrowingInput,
    assert_exactly_once,
    assert_shards_sound,
    prl_argv,
    prl_env,
    run_prl,
)
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401

pytestmark = pytest.mark.campaign  # long: `make test-all`

KILLS = 20
S3_KILLS = 8
SEED = int(os.environ.get("PRL_KILL_SEED", "20261130"))  # other seeds: a longer local soak


def kill_loop(
    rng: random.Random,
    data: GrowingInput,
    recipe: str,
    out,
    kills: int,
    env: dict[str, str],
) -> dict[str, int]:
    """Grow the input, start ``prl run``, SIGKILL it at a random instant (or let it finish), ``kills`` times.
    The instants are drawn over the latest whole run's duration (the first run's, then each finished run's): on
    a machine whose load changes, a first run measured under load would otherwise let most later runs finish."""
    started = time.perf_counter()
    first = subprocess.run(prl_argv("run", recipe, "--json"), env=env, capture_output=True, text=True, timeout=300)
    full = time.perf_counter() - started
    assert first.returncode == 0, first.stderr
    outcomes = {"killed": 0, "finished": 0}
    for _ in range(kills):
        data.grow(rng.randint(5, 30))
        started = time.perf_counter()
        proc = subprocess.Popen(
            prl_argv("run", recipe, "--json"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:  # about the first fifth of a run is interpreter start-up: aim most kills past it
            proc.wait(timeout=rng.uniform(0.2 * full, 1.15 * full))
            full = time.perf_counter() - started
            outcomes["finished"] += 1
            assert proc.returncode == 0
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            outcomes["killed"] += 1
        if rng.random() < 0.3:  # between kills, published state is always sound
            assert_shards_sound(out, None)
    assert outcomes["killed"] >= kills // 2, outcomes
    return outcomes


@pytest.mark.slow
def test_sigkill_at_random_instants_loses_and_duplicates_nothing(tmp_path):
    rng = random.Random(SEED)
    data = GrowingInput(tmp_path / "in", files=3, seed=SEED % 1000, real_text=True)
    store_path, out = tmp_path / "store", tmp_path / "out"
    recipe = str(data.recipe(store_path, out, check=True))  # ingest → rewards → check-tokens → build-shards
    data.grow(40)
    kill_loop(rng, data, recipe, out, KILLS, prl_env())
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
    staging = Path(meta_root(out)) / "staging"
    assert not staging.exists() or not os.listdir(staging)


@pytest.mark.s3
@pytest.mark.slow
def test_sigkill_with_an_s3_store(s3, tmp_path):  # noqa: F811
    """The same on an ``s3://`` store (moto server), at the default stale time (300 s): the next run takes a
    killed run's S3 locks over at once, their holder having run on this host and being gone (a run that met
    one would exit 3, and a finished run must exit 0)."""
    rng = random.Random(SEED + 1)
    data = GrowingInput(tmp_path / "in", files=2, seed=SEED % 997)
    store_uri, out = s3.url("store"), tmp_path / "out"
    recipe = str(data.recipe(store_uri, out))  # type: ignore[arg-type]
    data.grow(30)
    env = prl_env({k: v for k, v in environ_for(s3.endpoint).items() if k != "PRL_LOCK_STALE_AFTER"})
    kill_loop(rng, data, recipe, out, S3_KILLS, env)
    final = subprocess.run(prl_argv("run", recipe, "--json"), env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    assert [s["status"] for s in json.loads(final.stdout)["steps"]] == ["done"] * 3
    assert_exactly_once(Store(store_uri), data)
    assert_shards_sound(out, data.good)
    assert s3.keys("store/_locks/") == []
