"""Builders of small stores for the shard tests: Arrow tables in the real schemas, committed with ``Store``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from prl.schema import CHECKS, REF_LOGPROBS, REWARDS, TRACES
from prl.store.tables import Store

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def trace(sample_id: str, group_id: str, prompt: list[int], completion: list[int], **extra: Any) -> dict[str, Any]:
    """One trace row; logprobs default to -0.1·(position + 1)."""
    row: dict[str, Any] = {
        "sample_id": sample_id,
        "request_id": sample_id.split(":")[0],
        "choice_index": 0,
        "group_id": group_id,
        "policy_version": "step-10",
        "created_at": T0,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_logprobs": [-0.1 * (i + 1) for i in range(len(completion))],
        "finish_reason": "stop",
        "temperature": 1.0,
        "top_p": 1.0,
        "record_digest": f"d-{sample_id}",
        "source_uri": "mem://traces",
        "source_line": 0,
        "source_format": "test",
        "ingested_at": T0,
    }
    row.update(extra)
    return row


def table(schema: pa.Schema, rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def reward(sample_id: str, value: float, name: str = "reward", at: int = 0, line: int = 0) -> dict[str, Any]:
    return {
        "sample_id": sample_id,
        "name": name,
        "value": value,
        "created_at": T0 + timedelta(seconds=at),
        "source_uri": "mem://rewards",
        "source_line": line,
        "ingested_at": T0,
    }


def verdict(sample_id: str, value: str = "ok", fingerprint: str = "tok-a", at: int = 0) -> dict[str, Any]:
    return {
        "sample_id": sample_id,
        "tokenizer_fingerprint": fingerprint,
        "verdict": value,
        "reasons": [],
        "checked_at": T0 + timedelta(seconds=at),
    }


def ref(sample_id: str, logprobs: list[float], model: str = "ref-a", at: int = 0) -> dict[str, Any]:
    return {
        "sample_id": sample_id,
        "ref_model": model,
        "ref_logprobs": logprobs,
        "source_uri": "mem://ref",
        "source_line": 0,
        "ingested_at": T0 + timedelta(seconds=at),
    }


def make_store(
    root: str,
    traces: list[dict[str, Any]],
    rewards: list[dict[str, Any]] | None = None,
    checks: list[dict[str, Any]] | str | None = "ok",
    refs: list[dict[str, Any]] | None = None,
) -> Store:
    """A store holding the given rows. ``checks="ok"`` gives every trace an ``ok`` verdict."""
    store = Store(root)
    store.commit("traces", table(TRACES, traces).to_batches())
    if rewards:
        store.commit("rewards", table(REWARDS, rewards).to_batches())
    if checks == "ok":
        checks = [verdict(t["sample_id"]) for t in traces]
    if checks:
        store.commit("checks", table(CHECKS, checks).to_batches())  # type: ignore[arg-type]
    if refs:
        store.commit("ref_logprobs", table(REF_LOGPROBS, refs).to_batches())
    return store


def random_store(root: str, n_groups: int, group_size: int, seed: int = 0, with_ref: bool = False) -> Store:
    """A store of ``n_groups × group_size`` random samples with rewards, ok verdicts and (optionally) refs."""
    rng = np.random.default_rng(seed)
    traces, rewards, refs = [], [], []
    for g in range(n_groups):
        prompt = rng.integers(2, 1000, rng.integers(1, 8)).tolist()
        for i in range(group_size):
            sid = f"r{g}-{i}:0"
            comp = rng.integers(2, 1000, rng.integers(1, 12)).tolist()
            lps = (-rng.exponential(1.0, len(comp))).astype(np.float32).tolist()
            traces.append(trace(sid, f"g{g}", prompt, comp, completion_logprobs=lps, source_line=len(traces)))
            rewards.append(reward(sid, float(rng.integers(0, 3))))
            if with_ref:
                refs.append(ref(sid, (np.asarray(lps) + rng.normal(0, 0.3, len(comp))).astype(np.float32).tolist()))
    return make_store(root, traces, rewards, "ok", refs if with_ref else None)


def varied_store(root: str, seed: int = 0, commits: int = 4, groups: int = 6) -> Store:
    """A store built over several commits (so scans yield several files): groups of one to four samples with
    random lengths, some loss masks, some null behaviour logprobs, heads of width 3 or 4, rewards, ``ok``
    verdicts, and reference logprobs for all but a few samples (some with a null entry)."""
    rng = np.random.default_rng(seed)
    store = Store(root)
    n = 0
    for c in range(commits):
        traces, rewards, refs = [], [], []
        for g in range(groups):
            prompt = rng.integers(2, 1000, int(rng.integers(1, 9))).tolist()
            for _ in range(int(rng.integers(1, 5))):
                sid = f"v{n}:0"
                n += 1
                length = int(rng.integers(1, 12))
                lps: list[float | None] = (-rng.exponential(1.0, length)).astype(np.float32).tolist()
                extra: dict[str, Any] = {}
                if rng.random() < 0.3:
                    extra["completion_mask"] = (rng.random(length) < 0.7).tolist()
                if rng.random() < 0.2:
                    lps[int(rng.integers(0, length))] = None
                width = int(rng.integers(3, 5))
                extra["topk_ids"] = [rng.choice(1000, width, replace=False).tolist() for _ in range(length)]
                extra["topk_logprobs"] = [sorted((-rng.exponential(2.0, width)).tolist(), reverse=True)] * length
                traces.append(
                    trace(
                        sid,
                        f"g{c}-{g}",
                        prompt,
                        rng.integers(2, 1000, length).tolist(),
                        completion_logprobs=lps,
                        source_line=n,
                        **extra,
                    )
                )
                rewards.append(reward(sid, float(rng.integers(0, 3))))
                if rng.random() < 0.9:
                    ref_lps = [None if v is None else v + float(rng.normal(0, 0.3)) for v in lps]
                    if rng.random() < 0.2:
                        ref_lps[0] = None
                    refs.append(ref(sid, ref_lps))
        store.commit("traces", table(TRACES, traces).to_batches())
        store.commit("rewards", table(REWARDS, rewards).to_batches())
        store.commit("checks", table(CHECKS, [verdict(t["sample_id"]) for t in traces]).to_batches())
        store.commit("ref_logprobs", table(REF_LOGPROBS, refs).to_batches())
    return store


def commit_group(store: Store, name: str) -> list[str]:
    """Commit one new group ``name`` of two samples (traces, rewards 1 and 0, ``ok`` verdicts): what the next
    build ships as one new set. Returns the sample ids."""
    ids = [f"{name}-{i}:0" for i in range(2)]
    store.commit("traces", table(TRACES, [trace(s, name, [3, 4], [5, 6, 7]) for s in ids]).to_batches())
    store.commit("rewards", table(REWARDS, [reward(ids[0], 1.0), reward(ids[1], 0.0)]).to_batches())
    store.commit("checks", table(CHECKS, [verdict(s) for s in ids]).to_batches())
    return ids


def commit_traces(store: Store, rows: list[dict], rewarded: list[str] | None = None, refs: bool = True) -> None:
    """Commit ``rows`` to traces (one data file), with a reward for each of ``rewarded`` (default: every row),
    an ``ok`` verdict for each and, with ``refs``, reference logprobs of −0.2 per completion token."""
    store.commit("traces", table(TRACES, rows).to_batches())
    ids = [r["sample_id"] for r in rows] if rewarded is None else rewarded
    if ids:
        store.commit("rewards", table(REWARDS, [reward(s, float(len(s) % 3)) for s in ids]).to_batches())
    store.commit("checks", table(CHECKS, [verdict(r["sample_id"]) for r in rows]).to_batches())
    if refs:
        lps = [ref(r["sample_id"], [-0.2] * len(r["completion_token_ids"])) for r in rows]
        store.commit("ref_logprobs", table(REF_LOGPROBS, lps).to_batches())


def grouped_rows(prefix: str, groups: int, size: int, version: str = "step-10") -> list[dict]:
    """``groups`` groups of ``size`` trace rows (``<prefix><g>-<k>:0`` in group ``<prefix>g<g>``) at ``version``."""
    return [
        trace(f"{prefix}{g}-{k}:0", f"{prefix}g{g}", [1, 2, 3], [4, 5, 6 + k], policy_version=version)
        for g in range(groups)
        for k in range(size)
    ]
