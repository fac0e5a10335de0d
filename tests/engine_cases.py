"""Cases the engines are compared on: the same inputs read, checked and built on the local engine, on an engine
cut into many tasks in this process (:mod:`tests.test_engine_tasks`) and on a Ray cluster
(:mod:`tests.test_engines_ray`, :mod:`tests.test_engines_ray_ingest`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from prl.store.tables import Store
from tests.conftest import write_lines
from tests.delta_log import commit_infos
from tests.records import vllm_chat, vllm_completion

SHARD_OPTIONS = {
    "target_tokens": 40,
    "kl": "advantages",
    "kl_coef": 0.1,
    "topk": "auto",
    "ref_model": "ref-a",
    "missing_ref": "drop",
}
"""build-shards options of the compared builds: KL into the advantages, heads, small shards (16 of them)."""

NEMO = Path(__file__).parent / "fixtures" / "nemo_gym" / "rollouts.jsonl"
TIMES = {"traces": ["ingested_at"], "quarantine": ["quarantined_at"], "rewards": ["ingested_at"]}


def chat(k: int, shift: int = 0) -> dict[str, Any]:
    ids = [10 + k + shift, 11 + k, 1]
    return vllm_chat(f"r{k}", [0, 5 + k, 6], [(ids, [-0.25, -0.5, -0.125]), (ids[:2], [-1.0, -2.0])])


def source_folder(folder: Path) -> Path:
    """Four files, read on the cluster's two CPUs as two runs (``a``-``b``, ``c``-``d``, by bytes): ``a`` ends in a
    line still being written, ``b`` is gzip with a bad line and a text-only record, ``c`` a NeMo Gym rollout with
    an inline reward; ``d`` repeats a record of ``a`` as it is and another with other tokens, so its run must be
    read again after the first (on the driver)."""
    write_lines(folder / "a.jsonl", [chat(k) for k in range(4)])
    with open(folder / "a.jsonl", "ab") as fh:
        fh.write(json.dumps(chat(4)).encode()[:40])  # no newline yet: left for a later run
    text_only = {"id": "t", "object": "chat.completion", "choices": [{"index": 0, "message": {"content": "hi"}}]}
    records = [vllm_completion(f"c{k}", [1, 2], [7, 9 + k], [-0.5, -4.0]) for k in range(3)]
    write_lines(folder / "b.jsonl.gz", [*records, "{not json", text_only], compression="gzip")
    shutil.copy(NEMO, folder / "c.jsonl")
    write_lines(folder / "d.jsonl", [chat(1), chat(2, shift=50), vllm_completion("d0", [3], [4, 5], [-1.0, -1.5])])
    return folder


def table(store: Store, name: str) -> list[dict[str, Any]]:
    rows = store.read(name).drop_columns(TIMES[name]).to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def commits(store: Store, name: str) -> list[dict[str, Any]]:
    infos = commit_infos(store, name)
    return [{k: v for k, v in info.items() if k.startswith("prl.") and k != "prl.commit_id"} for info in infos]


def ingest_summary(result) -> dict[str, Any]:
    out = result.to_json()
    for key in ("seconds", "store", "tokens_per_second"):
        out.pop(key)
    return out


def same_stores(local: Store, remote: Store) -> None:
    for name in ("traces", "quarantine", "rewards"):
        assert table(remote, name) == table(local, name), name
    assert commits(remote, "traces") == commits(local, "traces")  # ledger, resume points, command
