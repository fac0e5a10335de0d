"""prl: production-RL data pipelines — serving traces in, checked training shards out.

The library API (the ``prl`` command is a thin layer over these; each returns a typed result with
``exit_code`` and ``to_json()``)::

    import prl
    prl.ingest(["traces/"], "store/")                                  # serving traces → traces / quarantine
    prl.ingest_side_table(["rewards.jsonl"], "store/", kind="rewards")   # rewards / reference logprobs
    prl.check_tokens(prl.Store("store/"), "path/to/tokenizer.json")     # verdicts → checks
    prl.score_ref("store/", "ref-v1", endpoint="http://vllm:8000")       # reference logprobs → ref_logprobs
    prl.build_shards(prl.Store("store/"), "shards/")                    # Parquet shard sets + manifest
    prl.export_tinker("shards/<set-id>", "datums.jsonl")                # Tinker Datum records
    prl.run("recipes/demo.toml")                                         # every step a recipe names
    prl.inspect("store/"); prl.verify_shards("shards/")

Names are imported on first use, so ``import prl`` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_API = {
    "ingest": ("prl.ingestion.traces", "ingest"),
    "ingest_side_table": ("prl.ingestion.side_tables", "ingest_side_table"),
    "check_tokens": ("prl.checks", "check_tokens"),
    "score_ref": ("prl.score.run", "score_ref"),
    "build_shards": ("prl.shards.build", "build_shards"),
    "ShardOptions": ("prl.shards.options", "ShardOptions"),
    "export_tinker": ("prl.export.tinker", "export_tinker"),
    "run": ("prl.pipeline.runner", "run"),
    "inspect": ("prl.report.inspect", "inspect"),
    "verify_shards": ("prl.shards.verify", "verify_shards"),
    "Store": ("prl.store.tables", "Store"),
}

__all__ = [*sorted(_API), "__version__"]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _API[name]
    except KeyError:
        raise AttributeError(f"module 'prl' has no attribute {name!r}") from None
    value = getattr(import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
