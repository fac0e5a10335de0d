"""``prl inspect STORE|SHARDS``: what a store or a shard set holds, read with column projections only.

For a store: every table's version, rows, files and bytes (from the Delta log, no data read); traces by source
format, model and policy version; quarantine by table and reason (a ``truncated_line`` whose line was finished
later and landed in its table is the row's, not the quarantine's: counted once, as ``quarantine_superseded``
beside the table); token-check verdicts per tokenizer fingerprint
with drift rates and the most frequent reasons; reward events by name. Each aggregate is a polars lazy scan of
the few scalar columns it needs, run on the streaming engine: token columns are never read.

For a shard set, or an ``OUT`` folder of them: one line per set from its manifest, drops by reason, and
histograms of per-sample reward, advantage, mean KL, prompt and completion length, staleness and group size.
Shards are streamed one record batch at a time; only ``loss_mask`` (for completion lengths) and ``kl`` (for the
per-sample mean) among the list columns are read, and only the per-sample scalars (4 bytes each) are kept.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prl.errors import ExitCode, UsageError
from prl.schema import TABLES, VERDICTS
from prl.shards.layout import is_out, resolve
from prl.shards.manifest import Manifest
from prl.store.resolve import open_store
from prl.store.tables import Store, is_remote
from prl.text import counted

HISTOGRAM_BINS = 12
BATCH_ROWS = 2048
METRICS = ("reward", "advantage", "kl", "prompt_len", "completion_len", "staleness", "group_size")
"""Per-sample quantities the shard histograms show (``kl``: mean per-token KL over the sample's valid tokens)."""


def histogram(values: np.ndarray, bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Counts of finite ``values`` in ``bins`` equal-width bins, plus a summary.

    Integer-valued data gets bins of whole numbers (edges at half-integers; one bin per value when the range
    is at most ``bins``). Returns ``{count, unknown, min, max, mean, p50, integer, edges (nbins + 1 floats), counts
    (nbins ints)}``: ``unknown`` counts the values left out (NaN: a null, such as the staleness of a sample
    without a policy version); edges and counts are empty when there are no finite values.
    """
    values = np.asarray(values, dtype=np.float64)
    given = len(values)
    values = values[np.isfinite(values)]
    unknown = given - len(values)
    if len(values) == 0:
        return {
            "count": 0,
            "unknown": unknown,
            "min": None,
            "max": None,
            "mean": None,
            "p50": None,
            "integer": False,
            "edges": [],
            "counts": [],
        }
    lo, hi = float(values.min()), float(values.max())
    integer = bool(np.all(values == np.round(values)))
    if integer:  # bins of whole numbers, edges at half-integers: [lo - ½, lo - ½ + width, …]
        width = max(1, math.ceil((hi - lo + 1) / bins))
        edges = lo - 0.5 + width * np.arange(math.ceil((hi - lo + 1) / width) + 1)
    elif lo == hi:
        edges = np.array([lo - 0.5, hi + 0.5])
    else:
        edges = np.linspace(lo, hi, bins + 1)
    counts, edges = np.histogram(values, bins=edges)
    return {
        "count": len(values),
        "unknown": unknown,
        "min": lo,
        "max": hi,
        "mean": float(values.mean()),
        "p50": float(np.median(values)),
        "integer": integer,
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
    }


@dataclass
class StoreInspection:
    """What :func:`inspect_store` found."""

    uri: str
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    traces_by: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    quarantine_superseded: int = 0
    """``truncated_line`` records whose line, finished later, landed in its table: the row wins, and they are
    left out of :attr:`quarantine`."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[dict[str, Any]] = field(default_factory=list)
    kind: str = "store"

    @property
    def exit_code(self) -> int:
        return int(ExitCode.OK)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "inspect",
            "kind": self.kind,
            "uri": self.uri,
            "tables": self.tables,
            "traces_by": self.traces_by,
            "quarantine": self.quarantine,
            "quarantine_superseded": self.quarantine_superseded,
            "checks": self.checks,
            "rewards": self.rewards,
            "exit_code": self.exit_code,
        }

    def headline(self) -> str:
        """``store s3://b/store: traces v3 (120 rows), checks v1 (120 rows), …``."""
        tables = ", ".join(
            f"{name} v{t['version']} ({t['rows'] or 0:,} rows)"
            for name, t in self.tables.items()
            if t["version"] is not None
        )
        return f"store {self.uri}: {tables or 'no tables'}"


@dataclass
class ShardsInspection:
    """What :func:`inspect_shards` found."""

    path: str
    sets: list[dict[str, Any]] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    histograms: dict[str, dict[str, Any]] = field(default_factory=dict)
    kind: str = "shards"

    @property
    def exit_code(self) -> int:
        return int(ExitCode.OK)

    @property
    def totals(self) -> dict[str, int]:
        keys = ("rows", "tokens", "shards", "groups")
        return {k: sum(int(s.get(k) or 0) for s in self.sets) for k in keys}

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "inspect",
            "kind": self.kind,
            "path": self.path,
            "sets": self.sets,
            "totals": self.totals,
            "drops": self.drops,
            "histograms": self.histograms,
            "exit_code": self.exit_code,
        }

    def headline(self) -> str:
        totals = self.totals
        return (
            f"{counted(len(self.sets), 'shard set')} in {self.path}: {counted(totals['rows'], 'row')}, "
            f"{counted(totals['groups'], 'group')}, {counted(totals['tokens'], 'token')} in "
            f"{counted(totals['shards'], 'shard')}"
        )


# --- what is it? ---------------------------------------------------------------------------------------------
def _is_shards(path: str) -> bool:
    try:
        return bool(resolve(path)) or is_out(path)
    except UsageError:
        return False


def _is_store(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.isdir(os.path.join(path, name, "_delta_log")) for name in TABLES)


def inspect(path: str) -> StoreInspection | ShardsInspection:
    """Inspect ``path``: an ``s3://`` store, a store folder, a shard set or an ``OUT`` folder of shard sets."""
    if is_remote(path):
        return inspect_store(open_store(path, writing=False))
    if not os.path.exists(path):
        raise UsageError(f"{path} does not exist")
    if _is_shards(path):
        return inspect_shards(path)
    if _is_store(path):
        return inspect_store(open_store(path, writing=False))
    raise UsageError(f"{path} is neither a store (Delta tables) nor a shard set (manifest.json)")


# --- stores --------------------------------------------------------------------------------------------------
def _scan(store: Store, name: str, version: int) -> pl.LazyFrame:
    return pl.scan_delta(store.table_uri(name), version=version, storage_options=store.options or None)


def _collect(frame: pl.LazyFrame) -> pl.DataFrame:
    return frame.collect(engine="streaming")


LANDED = ("traces", "rewards", "ref_logprobs")
"""Tables whose rows carry the ``source_uri`` and ``source_line`` they were read from."""


def _superseded(store: Store, quarantine: pl.LazyFrame, versions: dict[str, int]) -> pl.DataFrame | None:
    """The ``(table, source_uri, source_line, reason)`` of each ``truncated_line`` record whose line landed in its
    table later (the file's writer finished the line and a later ingest read it): the row wins. None: none."""
    cut = _collect(
        quarantine.filter(pl.col("reason") == "truncated_line").select("table", "source_uri", "source_line", "reason")
    ).unique()
    if cut.height == 0:
        return None
    found = []
    for name in LANDED:
        if name not in versions or cut.filter(pl.col("table") == name).height == 0:
            continue
        keys = cut.filter(pl.col("table") == name)
        landed = _scan(store, name, versions[name]).select("source_uri", "source_line")
        found.append(keys.lazy().join(landed.unique(), on=["source_uri", "source_line"], how="semi"))
    return _collect(pl.concat(found)) if found else None


def inspect_store(store: Store) -> StoreInspection:
    """Table sizes and the aggregates of the module docstring, at each table's current version."""
    result = StoreInspection(uri=store.uri)
    versions: dict[str, int] = {}
    for name in TABLES:
        table = store.open(name)
        if table is None:
            result.tables[name] = {"version": None, "rows": 0, "files": 0, "bytes": 0}
            continue
        versions[name] = table.version()
        adds = pa.table(table.get_add_actions(flatten=True))
        rows = adds.column("num_records") if "num_records" in adds.column_names else None
        result.tables[name] = {
            "version": versions[name],
            "rows": int(pc.sum(rows).as_py() or 0) if rows is not None else None,
            "files": adds.num_rows,
            "bytes": int(pc.sum(adds.column("size_bytes")).as_py() or 0),
        }
    if "traces" in versions:
        traces = _scan(store, "traces", versions["traces"])
        for column in ("source_format", "model", "policy_version"):
            counts = _collect(
                traces.group_by(column)
                .agg(pl.len().alias("samples"))
                .sort(["samples", column], descending=[True, False], nulls_last=True)
            )
            result.traces_by[column] = [
                {"value": value, "samples": n} for value, n in counts.select(column, "samples").rows()
            ]
    if "quarantine" in versions:
        quarantine = _scan(store, "quarantine", versions["quarantine"])
        superseded = _superseded(store, quarantine, versions)
        if superseded is not None:
            result.quarantine_superseded = superseded.height
            quarantine = quarantine.join(superseded.lazy(), on=list(superseded.columns), how="anti")
        counts = _collect(
            quarantine.group_by("table", "reason")
            .agg(pl.len().alias("records"))
            .sort(["records", "table", "reason"], descending=[True, False, False])
        )
        result.quarantine = counts.to_dicts()
    if "checks" in versions:
        result.checks = _check_summary(_scan(store, "checks", versions["checks"]))
    if "rewards" in versions:
        summary = _collect(
            _scan(store, "rewards", versions["rewards"])
            .group_by("name")
            .agg(
                pl.len().alias("events"),
                pl.col("sample_id").n_unique().alias("samples"),
                pl.col("value").mean().alias("mean"),
                pl.col("value").min().alias("min"),
                pl.col("value").max().alias("max"),
            )
            .sort("name")
        )
        result.rewards = summary.to_dicts()
    return result


def _check_summary(checks: pl.LazyFrame) -> list[dict[str, Any]]:
    """Per tokenizer fingerprint: verdict counts of each sample's latest verdict, drift rate, top reasons."""
    latest = (
        checks.select("sample_id", "tokenizer_fingerprint", "verdict", "reasons", "checked_at")
        .sort("checked_at")
        .group_by("tokenizer_fingerprint", "sample_id")
        .agg(pl.col("verdict").last(), pl.col("reasons").last())
    )
    verdicts = _collect(latest.group_by("tokenizer_fingerprint", "verdict").agg(pl.len().alias("n")))
    reasons = _collect(
        latest.select("tokenizer_fingerprint", "reasons")
        .explode("reasons")
        .drop_nulls("reasons")
        .group_by("tokenizer_fingerprint", "reasons")
        .agg(pl.len().alias("n"))
        .sort(["n", "reasons"], descending=[True, False])
    )
    out = []
    for (fingerprint,), part in sorted(verdicts.group_by("tokenizer_fingerprint"), key=lambda kv: str(kv[0])):
        counts = dict.fromkeys(VERDICTS, 0)
        counts.update(dict(part.select("verdict", "n").rows()))
        checked = sum(counts.values())
        top = reasons.filter(pl.col("tokenizer_fingerprint") == fingerprint).head(8)
        out.append(
            {
                "tokenizer_fingerprint": fingerprint,
                "checked": checked,
                "verdicts": counts,
                "drift_rate": (counts["drift"] + counts["invalid"]) / checked if checked else 0.0,
                "warn_rate": counts["warn"] / checked if checked else 0.0,
                "note_rate": counts["note"] / checked if checked else 0.0,
                "top_reasons": dict(top.select("reasons", "n").rows()),
            }
        )
    return out


# --- shard sets ----------------------------------------------------------------------------------------------
def _set_line(manifest: Manifest) -> dict[str, Any]:
    return {
        "set_id": manifest.set_id,
        "rows": manifest.totals.rows,
        "groups": manifest.totals.groups,
        "tokens": manifest.totals.tokens,
        "completion_tokens": manifest.totals.completion_tokens,
        "shards": manifest.totals.shards,
        "source_versions": manifest.source_versions,
        "current_version": manifest.current_version,
        "excluded_sets": len(manifest.excluded_sets),
        "advantage": manifest.options.get("advantage"),
        "kl": manifest.kl,
        "topk": manifest.topk,
        "groups_of_one": manifest.statistics.get("groups_of_one"),
        "dropped": sum(manifest.drops.values()),
    }


def _shard_metrics(path: str, with_kl: bool) -> dict[str, list[np.ndarray]]:
    """Per-sample scalars of one shard file, streamed by record batch."""
    columns = ["reward", "advantage", "staleness", "prompt_len", "group_size", "loss_mask"]
    if with_kl:
        columns.append("kl")
    out: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=columns):
        for name in ("reward", "advantage", "staleness", "prompt_len", "group_size"):
            out[name].append(batch.column(name).to_numpy(zero_copy_only=False).astype(np.float32))
        lengths = pc.fill_null(pc.list_value_length(batch.column("loss_mask")), 0)
        out["completion_len"].append(lengths.to_numpy(zero_copy_only=False).astype(np.float32))
        if with_kl:
            means = pl.from_arrow(batch.column("kl")).list.mean()  # type: ignore[union-attr]
            out["kl"].append(means.to_numpy().astype(np.float32))
    return out


def inspect_shards(path: str) -> ShardsInspection:
    """Manifest lines, drops and per-sample histograms of a shard set or every set of an ``OUT`` folder."""
    path = os.path.abspath(path)
    result = ShardsInspection(path=path)
    values: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
    for ref in resolve(path):
        folder, manifest = ref.dir, Manifest.of(ref)
        result.sets.append(_set_line(manifest))
        for reason, count in manifest.drops.items():
            result.drops[reason] = result.drops.get(reason, 0) + count
        for entry in manifest.shards:
            for name, parts in _shard_metrics(os.path.join(folder, entry.file), manifest.kl != "none").items():
                values[name].extend(parts)
    result.drops = dict(sorted(result.drops.items(), key=lambda kv: (-kv[1], kv[0])))
    for name in METRICS:
        if values[name]:
            result.histograms[name] = histogram(np.concatenate(values[name]))
    return result


__all__ = ["ShardsInspection", "StoreInspection", "histogram", "inspect", "inspect_shards", "inspect_store"]
