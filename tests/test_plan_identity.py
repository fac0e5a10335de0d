"""The plan and the shard set of a store that exercises every join of the plan are pinned: what ships, in which
order and shard, with which values, and why the rest does not.

The store holds several commits of traces with duplicate sample ids, stale and unknown policy versions, a group
whose rewards are all equal, rewards restated later (the latest per component wins, two components), verdicts
restated (warn, drift, invalid, ok), reference rows ingested twice or missing. The expected digests are those of
the shard contents (values read back, not file bytes, so they do not follow the Parquet writer) and of the plan's
shipped rows.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from prl.schema import CHECKS, REF_LOGPROBS, REWARDS, TRACES
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.shards.plan import make_plan
from prl.shards.rewards import resolve_rewards
from prl.store.tables import Store
from tests.shards_fixtures import ref, reward, table, trace, verdict


def joined_store(root: str) -> Store:
    """Three commits of 8 groups × 3 samples, with the irregularities the module docstring names."""
    rng = np.random.default_rng(7)
    store = Store(root)
    n = 0
    for c in range(3):
        traces, rewards, checks, refs = [], [], [], []
        for g in range(8):
            prompt = rng.integers(2, 1000, int(rng.integers(1, 6))).tolist()
            for _ in range(3):
                sid = f"s{n}:0" if n % 17 else f"s{n - 1}:0"  # every 17th repeats the sample before
                n += 1
                length = int(rng.integers(1, 9))
                lps = (-rng.exponential(1.0, length)).astype(np.float32).tolist()
                version = "step-x" if n % 23 == 0 else f"step-{10 - int(rng.integers(0, 4))}"
                comp = rng.integers(2, 1000, length).tolist()
                traces.append(trace(sid, f"g{c}-{g}", prompt, comp, completion_logprobs=lps, policy_version=version))
                value = 1.0 if g == 5 else float(rng.integers(0, 3))
                rewards.append(reward(sid, value, at=0, line=n))
                rewards.append(reward(sid, float(rng.integers(0, 2)), name="format", at=1, line=n))
                if n % 5 == 0:  # restated later: the later value wins
                    rewards.append(reward(sid, value + 0.5, at=2, line=n))
                checks.append(verdict(sid, ["ok", "ok", "ok", "warn", "drift", "invalid"][n % 6], at=0))
                if n % 4 == 0:
                    checks.append(verdict(sid, "ok", at=1))
                if n % 11:
                    ref_lps = [v + float(rng.normal(0, 0.3)) for v in lps]
                    refs.append(ref(sid, ref_lps, at=0))
                    if n % 3 == 0:
                        refs.append(ref(sid, [v + 0.25 for v in ref_lps], at=1))
        store.commit("traces", table(TRACES, traces).to_batches())
        store.commit("rewards", table(REWARDS, rewards).to_batches())
        store.commit("checks", table(CHECKS, checks).to_batches())
        store.commit("ref_logprobs", table(REF_LOGPROBS, refs).to_batches())
    return store


OPTIONS = dict(
    kl="advantages",
    kl_coef=0.05,
    missing_ref="drop",
    max_staleness=2,
    drop_constant_groups=True,
    rewards={"reward": 1.0, "format": 0.5},
    target_tokens=60,
)


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_plan_of_a_joined_store(tmp_path):
    store = joined_store(str(tmp_path / "store"))
    versions = store.versions()
    options = resolve_rewards(store, versions["rewards"], ShardOptions(**OPTIONS))
    plan = make_plan(store, versions, options, None)
    assert plan.drops == {
        "duplicate_sample_id": 8,
        "unknown_version": 2,
        "stale": 11,
        "verdict_warn": 7,
        "verdict_drift": 4,
        "verdict_invalid": 7,
        "missing_ref": 2,
        "constant_group": 4,
    }
    assert plan.considered == 72 and plan.constant_groups == 2 and plan.ship.height == 27
    assert plan.ship.columns == [
        "row",
        "sample_id",
        "group_id",
        "policy_version",
        "policy_version_spans",
        "temperature",
        "top_p",
        "top_k",
        "logprobs_mode",
        "prompt_len",
        "completion_len",
        "has_mask",
        "policy_step",
        "staleness",
        "ref_row",
        "score",
        "shard",
    ]
    assert plan.ship["shard"].to_list() == [0] * 7 + [1] * 9 + [2] * 5 + [3] * 6
    assert digest(plan.ship.to_dicts()) == "e8f94b0cf0dd3722"


def test_set_of_a_joined_store(tmp_path):
    store = joined_store(str(tmp_path / "store"))
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(**OPTIONS))
    manifest = json.loads(Path(res.manifest_path).read_text())
    contents = [pq.read_table(os.path.join(res.set_dir, s["file"])).to_pylist() for s in manifest["shards"]]
    assert [len(c) for c in contents] == [7, 9, 5, 6]
    assert [digest(c) for c in contents] == [
        "82cc42db41dd64f7",
        "4937d0c18a26e74f",
        "7637937441400d66",
        "feb80fba2e3e9194",
    ]
    assert digest(manifest["statistics"]) == "4e155f20182a6247"  # the statistics of before and kl.at_cap (0)
