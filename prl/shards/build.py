"""``prl build-shards``: checked traces + rewards (+ reference logprobs) → Parquet shard sets (design.md §5–6).

How a build runs (memory is bounded by one shard per worker thread plus a few scalars per sample, never by the
table's token data):

1. **Pin** the source: ``store.versions()`` is read once and every scan reads exactly those table versions.
2. **Plan**: stream ``traces`` in batches, keeping per sample its scan row number, ids, version, finish reason,
   sampling settings and token counts (list lengths). Join the latest reward per (sample_id, name), the latest
   token-check verdict, and (with KL) the latest reference row's length. Apply every filter; each dropped sample is
   counted under the first reason it fails, in the order of :data:`DROP_REASONS`. Samples already shipped by an
   earlier set in ``OUT`` are skipped (unless ``rebuild``). The four reads run side by side in threads.
3. **Spill** (during the plan scans, so token columns are decoded once per build): the token columns of every
   row not shipped before (and its ``ref_logprobs``) are appended, in scan order, to an Arrow IPC file in the
   staging folder (:class:`prl.shards.spill.ScanSpill`); a dry run spills nothing. With KL into the advantages, the
   scans also sum each side's logprobs per row (the batch mean log ratio needs nothing more for rows whose
   tokens all count).
4. **Pack**: groups (by ``group_id``) are sorted, shuffled with ``options.seed`` and laid out back to back; a
   group belongs to the shard in whose ``target_tokens`` window its first token falls, so groups stay whole and
   shards hold about ``target_tokens`` tokens. Within a group, samples follow ``sample_id``. Each shard is a run
   of the final order.
5. **Numerics and assembly**: each shard gathers its rows from the spill files, in final order. With KL into the
   reward, a first pass computes per-sample KL sums; with KL into the advantages, only the rows the scans could
   not sum (a loss mask, a missing or non-finite logprob) are read for the batch mean log ratio. Advantages are
   then computed over exactly the rows that ship (:mod:`prl.numerics.advantages`), and each shard is assembled
   (:mod:`prl.numerics.kl` over cache-sized blocks of samples, :mod:`prl.numerics.heads`) and written. Shards are gathered,
   assembled, written and hashed (:mod:`prl.shards.writer`, pyarrow) by :data:`WORKERS` threads while
   :data:`IO_THREADS` fsync and rename the files written; every value is computed per shard or per sample, so
   the bytes do not depend on the threads.
6. **Publish**: parts are written as ``*.tmp``, fsynced and renamed; ``manifest.json`` is written last (temp file,
   fsync, rename); then the whole staging folder is renamed to ``OUT/<set-id>/`` and ``OUT/_index.json`` is
   rewritten from the manifests present. A reader that sees a set folder sees its manifest and every shard it names.

The set id is derived from the source table versions, the options, the earlier sets whose samples were
skipped and the Parquet writer (pyarrow's version), and nothing in a set depends on the clock, so building the same
inputs again with the same pyarrow yields the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from prl.errors import ExitCode, UsageError
from prl.numerics import advantages as adv
from prl.numerics import heads
from prl.numerics import kl as klmod
from prl.schema import SCHEMA_VERSION, SHARD
from prl.shards import writer
from prl.shards.options import ShardOptions
from prl.shards.spill import FlatList, ScanSpill
from prl.store.locks import holding, pid_alive, step_name
from prl.store.tables import Store

DROP_REASONS = (
    "duplicate_sample_id",
    "finish_reason",
    "empty_completion",
    "too_short",
    "prompt_too_long",
    "completion_too_long",
    "too_long",
    "mask_length_mismatch",
    "unknown_version",
    "stale",
    "unchecked",
    "verdict_warn",
    "verdict_drift",
    "verdict_invalid",
    "missing_reward",
    "nonfinite_reward",
    "missing_ref",
    "ref_length_mismatch",
    "missing_heads",
    "heads_too_narrow",
    "truncated_sampling",
    "constant_group",
)
"""Why a sample did not ship, in the order they are tested (a sample counts under its first reason)."""

MANIFEST = "manifest.json"
SAMPLES_FILE = "sample_ids.parquet"
INDEX = "_index.json"
SCAN_BATCH_ROWS = 1024
WORKERS = 2
IO_THREADS = 4
"""Threads that fsync and rename written files while the workers go on (they mostly wait on the disk)."""
BLOCK_TOKENS = 1 << 16
"""Per-token numerics run over blocks of whole samples of about this many tokens: their float64 temporaries
(512 KiB each) are reused from block to block and stay in cache instead of faulting in fresh pages."""
"""Threads that assemble and write shards side by side (numpy, Arrow, Parquet and zstd release the GIL)."""
_VERSION_RE = r"(\d+)\D*$"


def parse_version(version: str | int | None) -> int | None:
    """The integer in a policy version string: ``"step-120"`` → 120, ``"120"`` → 120, none → None."""
    if version is None:
        return None
    match = re.search(_VERSION_RE, str(version))
    return int(match.group(1)) if match else None


@dataclass
class ShardResult:
    """What :func:`build_shards` did. ``status``: ``built``, ``nothing_new`` or ``dry_run``."""

    out: str
    status: str
    set_id: str | None = None
    set_dir: str | None = None
    rows: int = 0
    tokens: int = 0
    shards: list[dict[str, Any]] = field(default_factory=list)
    considered: int = 0
    already_shipped: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    statistics: dict[str, Any] = field(default_factory=dict)
    source_versions: dict[str, int | None] = field(default_factory=dict)
    drop_rate_exceeded: bool = False

    @property
    def exit_code(self) -> int:
        return int(ExitCode.DATA_PROBLEMS if self.drop_rate_exceeded else ExitCode.OK)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "build-shards",
            "out": self.out,
            "status": self.status,
            "set_id": self.set_id,
            "set_dir": self.set_dir,
            "rows": self.rows,
            "tokens": self.tokens,
            "shards": self.shards,
            "considered": self.considered,
            "already_shipped": self.already_shipped,
            "dropped": sum(self.drops.values()),
            "drops": self.drops,
            "statistics": self.statistics,
            "source_versions": self.source_versions,
            "exit_code": self.exit_code,
        }


# --- helpers -------------------------------------------------------------------------------------------------
def _lengths(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return pc.fill_null(pc.list_value_length(column), 0).cast(pa.int64())


def _rows_all(flags_T: np.ndarray, offsets_N1: np.ndarray) -> np.ndarray:
    """Per row of a flat bool array: are all its flags True (an empty row: True)."""
    lengths_N = np.diff(offsets_N1)
    out_N = np.ones(len(lengths_N), dtype=bool)
    nonempty_N = lengths_N > 0
    if nonempty_N.any():
        out_N[nonempty_N] = np.logical_and.reduceat(flags_T[: offsets_N1[-1]], offsets_N1[:-1][nonempty_N])
    return out_N


def _side_sums(lists: pa.ListArray, masks: pa.ListArray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(sums_N, simple_N)`` of a batch's logprob lists: each row's float64 sum (:func:`prl.numerics.kl.segment_sum`) and
    whether every value of the row counts in a log ratio on its side alone: finite, not null, and inside the
    row's ``masks`` (a null mask covers the whole row)."""
    offsets_N1 = lists.offsets.to_numpy().astype(np.int64)
    values_T = lists.values.slice(int(offsets_N1[0]), int(offsets_N1[-1] - offsets_N1[0]))
    offsets_N1 -= offsets_N1[0]
    values_T = values_T.to_numpy(zero_copy_only=False)  # nulls → NaN
    simple_N = _rows_all(np.isfinite(values_T), offsets_N1)
    if masks is not None and masks.null_count < len(masks):
        mask_off = masks.offsets.to_numpy().astype(np.int64)
        mask_vals = masks.values.slice(int(mask_off[0]), int(mask_off[-1] - mask_off[0]))
        mask_T = pc.fill_null(mask_vals, False).to_numpy(zero_copy_only=False)
        simple_N &= _rows_all(mask_T, mask_off - mask_off[0]) | ~masks.is_valid().to_numpy(zero_copy_only=False)
    return klmod.segment_sum(values_T, offsets_N1), simple_N


def _summary(values: np.ndarray) -> dict[str, float | int | None]:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return {"count": 0, "mean": None, "std": None, "min": None, "p50": None, "p95": None, "max": None}
    p50, p95 = np.quantile(values, [0.5, 0.95])
    return {
        "count": len(values),
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "p50": float(p50),
        "p95": float(p95),
        "max": float(values.max()),
    }


def sha256_file(path: str) -> str:
    """Hex sha256 of a file's bytes, read in 4 MiB chunks into one reused buffer."""
    digest = hashlib.sha256()
    buffer = bytearray(1 << 22)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish_file(tmp: str, final: str) -> None:
    """fsync ``tmp`` and rename it to ``final``."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def _write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, allow_nan=False)
        fh.write("\n")
    _publish_file(tmp, path)


def _clean_stale_staging(out: str) -> None:
    """Remove staging folders left by killed builds (their pid is gone)."""
    for name in os.listdir(out):
        if not name.startswith((".staging-", ".trash-")):
            continue
        parts = name.split("-")
        pid = int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None
        if pid is None or not pid_alive(pid):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)


def existing_sets(out: str) -> list[dict[str, Any]]:
    """Manifests of the complete shard sets in ``out`` (folders holding a ``manifest.json``), by set id."""
    if not os.path.isdir(out):
        return []
    manifests = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name, MANIFEST)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as fh:
            manifests.append(json.load(fh))
    return manifests


def _write_index(out: str) -> None:
    sets = existing_sets(out)
    sets.sort(key=lambda m: (len(m.get("excluded_sets", [])), m["set_id"]))
    _write_json(
        os.path.join(out, INDEX),
        {
            "schema_version": SCHEMA_VERSION,
            "sets": [
                {
                    "set_id": m["set_id"],
                    "rows": m["totals"]["rows"],
                    "tokens": m["totals"]["tokens"],
                    "source_versions": m["source"]["versions"],
                    "options_sha256": m["options_sha256"],
                    "samples_file": f"{m['set_id']}/{m['samples']['file']}",
                }
                for m in sets
            ],
        },
    )


# --- plan ----------------------------------------------------------------------------------------------------
def _spill_rows(
    spill: ScanSpill, batch: pa.RecordBatch, columns: list[str], first_row: int, exclude: pa.Array | None
) -> None:
    """Spill ``columns`` of the rows of ``batch`` (scan rows from ``first_row``) whose sample is not excluded."""
    rows = np.arange(first_row, first_row + batch.num_rows, dtype=np.int64)
    part = batch.select(columns)
    if exclude is not None and len(exclude):
        keep = pc.invert(pc.is_in(batch["sample_id"], value_set=exclude))
        if not pc.all(keep).as_py():
            part = part.filter(keep)
            rows = rows[keep.to_numpy(zero_copy_only=False)]
    spill.write(part, rows)


HEAD_COLUMNS = ("topk_ids", "topk_logprobs")


_PLAN_TRACE_SCALARS = (
    "sample_id",
    "group_id",
    "policy_version",
    "finish_reason",
    "temperature",
    "top_p",
    "top_k",
    "logprobs_mode",
)
"""Trace columns the plan keeps as they are, per sample."""


def _side_sums_wanted(options: ShardOptions, spill: ScanSpill | None) -> bool:
    """Whether the plan scans sum each side's logprobs per row: for KL into the advantages, in a real build (a dry
    run computes no KL)."""
    return options.kl == "advantages" and spill is not None


def _scanned(
    store: Store,
    name: str,
    columns: list[str],
    version: int,
    spill: ScanSpill | None,
    spill_columns: list[str],
    exclude: pa.Array | None,
    filter: ds.Expression | None = None,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(first scan row number, batch)`` of table ``name`` at ``version``; with ``spill``, ``spill_columns`` of
    every row whose sample is not in ``exclude`` are spilled as the batches go by."""
    row = 0
    batch_rows = SCAN_BATCH_ROWS if spill is not None else SCAN_BATCH_ROWS * 8
    for batch in store.scan(name, columns=columns, filter=filter, batch_size=batch_rows, version=version):
        if spill is not None:
            _spill_rows(spill, batch, spill_columns, row, exclude)
        yield row, batch
        row += batch.num_rows


def _trace_spill_columns(options: ShardOptions) -> list[str]:
    cols = ["prompt_token_ids", "completion_token_ids", "completion_logprobs", "completion_mask"]
    return cols + (list(HEAD_COLUMNS) if options.topk is not None else [])


def _scan_plan_traces(
    store: Store,
    version: int,
    options: ShardOptions,
    spill: ScanSpill | None = None,
    exclude: pa.Array | None = None,
) -> pl.DataFrame:
    """Per-sample scalars of every trace row, with its scan row number (``row``). With ``spill``, the token
    columns of every row whose ``sample_id`` is not in ``exclude`` are spilled as they are decoded."""
    columns = [*_PLAN_TRACE_SCALARS, "prompt_token_ids", "completion_token_ids", "completion_mask"]
    baseline = options.singleton_baseline
    if baseline not in ("batch", "none") and baseline not in columns:
        columns.append(baseline)
    if options.topk is not None:
        columns.append("topk_ids")
    with_sums = _side_sums_wanted(options, spill)
    if with_sums:
        columns.append("completion_logprobs")
    spill_columns = _trace_spill_columns(options)
    if spill is not None:
        columns += [c for c in spill_columns if c not in columns]
    frames = []
    for row, batch in _scanned(store, "traces", columns, version, spill, spill_columns, exclude):
        n = batch.num_rows
        completion_len = _lengths(batch["completion_token_ids"])
        has_mask = pc.is_valid(batch["completion_mask"])
        cols = {
            "row": pa.array(np.arange(row, row + n, dtype=np.int64)),
            **{c: batch[c] for c in _PLAN_TRACE_SCALARS},
            "prompt_len": _lengths(batch["prompt_token_ids"]),
            "completion_len": completion_len,
            "has_mask": has_mask,
            "mask_len": pc.if_else(has_mask, _lengths(batch["completion_mask"]), completion_len),
        }
        if baseline not in ("batch", "none"):
            cols["baseline_key"] = batch[baseline].cast(pa.string())
        if options.topk is not None:
            cols["head_width"] = pa.array(heads.min_head_width(batch["topk_ids"]))
        if with_sums:
            lp_sum, lp_simple = _side_sums(batch["completion_logprobs"], batch["completion_mask"])
            cols["lp_sum"], cols["lp_simple"] = pa.array(lp_sum), pa.array(lp_simple)
        frames.append(pa.table(cols))  # one conversion to polars at the end, not one per batch
    if not frames:
        return pl.DataFrame()
    return pl.from_arrow(pa.concat_tables(frames))  # type: ignore[return-value]


def _latest_rewards(store: Store, version: int | None, names: list[str]) -> pl.DataFrame:
    """``sample_id`` + one float64 column ``r::<name>`` per component (latest event per sample and name)."""
    cols = ["sample_id", "name", "value", "created_at", "ingested_at", "source_uri", "source_line"]
    out = pl.DataFrame({"sample_id": pl.Series([], dtype=pl.String)})
    if version is None:
        return out.with_columns([pl.lit(None, dtype=pl.Float64).alias(f"r::{n}") for n in names])
    table = store.read("rewards", columns=cols, filter=pc.field("name").isin(names), version=version)
    latest = (
        pl.from_arrow(table)
        .sort(["sample_id", "name", "created_at", "ingested_at", "source_uri", "source_line"])
        .unique(subset=["sample_id", "name"], keep="last", maintain_order=True)
    )
    wide = latest.select("sample_id").unique()
    for name in names:
        part = latest.filter(pl.col("name") == name).select("sample_id", pl.col("value").alias(f"r::{name}"))
        wide = wide.join(part, on="sample_id", how="left")
    return wide


def _latest_verdicts(store: Store, version: int | None, fingerprint: str | None) -> pl.DataFrame:
    if version is None:
        return pl.DataFrame({"sample_id": pl.Series([], dtype=pl.String), "verdict": pl.Series([], dtype=pl.String)})
    flt = pc.field("tokenizer_fingerprint") == fingerprint if fingerprint else None
    table = store.read(
        "checks",
        columns=["sample_id", "verdict", "checked_at", "tokenizer_fingerprint"],
        filter=flt,
        version=version,
    )
    severity = {"ok": 0, "warn": 1, "drift": 2, "invalid": 3}
    return (
        pl.from_arrow(table)
        .with_columns(pl.col("verdict").replace_strict(severity, default=4).alias("_sev"))
        .sort(["sample_id", "checked_at", "_sev", "tokenizer_fingerprint"])
        .unique(subset=["sample_id"], keep="last", maintain_order=True)
        .select("sample_id", "verdict")
    )


def _ref_filter(options: ShardOptions) -> ds.Expression | None:
    return pc.field("ref_model") == options.ref_model if options.ref_model else None


def _scan_plan_refs(
    store: Store,
    version: int,
    options: ShardOptions,
    spill: ScanSpill | None = None,
    exclude: pa.Array | None = None,
) -> pl.DataFrame:
    """The winning reference row per sample (latest ingest) with its scan row number (``ref_row``) and length.
    With ``spill``, ``ref_logprobs`` of every row whose ``sample_id`` is not in ``exclude`` is spilled."""
    frames = []
    with_sums = _side_sums_wanted(options, spill)
    columns = ["sample_id", "ingested_at", "source_uri", "source_line", "ref_logprobs"]
    spilled = ["ref_logprobs"]
    for row, batch in _scanned(store, "ref_logprobs", columns, version, spill, spilled, exclude, _ref_filter(options)):
        n = batch.num_rows
        cols = {
            "ref_row": pa.array(np.arange(row, row + n, dtype=np.int64)),
            **{c: batch[c] for c in columns[:-1]},  # sample_id and what picks the latest row
            "ref_len": _lengths(batch["ref_logprobs"]),
        }
        if with_sums:
            ref_sum, ref_simple = _side_sums(batch["ref_logprobs"])
            cols["ref_sum"], cols["ref_simple"] = pa.array(ref_sum), pa.array(ref_simple)
        frames.append(pa.table(cols))
    keep = ["sample_id", "ref_row", "ref_len"] + (["ref_sum", "ref_simple"] if with_sums else [])
    if not frames:
        empty = {"sample_id": pl.String, "ref_row": pl.Int64, "ref_len": pl.Int64, "ref_sum": pl.Float64}
        return pl.DataFrame(schema={c: empty.get(c, pl.Boolean) for c in keep})
    return (
        pl.from_arrow(pa.concat_tables(frames))  # type: ignore[union-attr]
        .sort(["sample_id", "ingested_at", "source_uri", "source_line", "ref_row"])
        .unique(subset=["sample_id"], keep="last", maintain_order=True)
        .select(keep)
    )


def _drop_reasons(options: ShardOptions, with_ref: bool) -> pl.Expr:
    """One expression naming each sample's first failed filter (null when it passes them all)."""
    o = options
    c = pl.col
    rules: list[tuple[str, pl.Expr]] = [
        ("duplicate_sample_id", c("sample_id").is_duplicated()),
        ("finish_reason", ~c("finish_reason").is_in(list(o.finish_reasons))),
        ("empty_completion", c("completion_len") == 0),
        ("too_short", c("completion_len") < o.min_completion_tokens),
    ]
    if o.max_prompt_tokens is not None:
        rules.append(("prompt_too_long", c("prompt_len") > o.max_prompt_tokens))
    if o.max_completion_tokens is not None:
        rules.append(("completion_too_long", c("completion_len") > o.max_completion_tokens))
    if o.max_total_tokens is not None:
        rules.append(("too_long", c("prompt_len") + c("completion_len") > o.max_total_tokens))
    rules.append(("mask_length_mismatch", c("mask_len") != c("completion_len")))
    if o.max_staleness is not None:
        rules.append(("unknown_version", c("staleness").is_null()))
        rules.append(("stale", c("staleness") > o.max_staleness))
    if o.require_checks:
        rules.append(("unchecked", c("verdict").is_null()))
    if not o.allow_warn:
        rules.append(("verdict_warn", c("verdict") == "warn"))
    rules.append(("verdict_drift", c("verdict") == "drift"))
    rules.append(("verdict_invalid", c("verdict") == "invalid"))
    rules.append(("missing_reward", c("_score_missing")))
    rules.append(("nonfinite_reward", ~c("score").is_finite()))
    if with_ref:
        rules.append(("missing_ref", c("ref_row").is_null()))
        rules.append(("ref_length_mismatch", c("ref_len") != c("completion_len")))
    if o.topk is not None:
        rules.append(("missing_heads", c("head_width") < 0))
        if o.topk != "auto":
            rules.append(("heads_too_narrow", c("head_width") < int(o.topk)))
        rules.append(
            (
                "truncated_sampling",
                (c("top_p").fill_null(1.0) < 1.0) | (c("top_k").fill_null(-1) > 0),
            )
        )
    expr: Any = pl
    for name, cond in rules:
        expr = expr.when(cond.fill_null(False)).then(pl.lit(name))
    return expr.otherwise(pl.lit(None, dtype=pl.String))


@dataclass
class _Plan:
    """The shipped samples in final order, with their shard numbers, and what was dropped."""

    ship: pl.DataFrame
    """Columns: row, sample_id, group_id, policy_version, staleness, prompt_len, completion_len, has_mask, score,
    shard, (ref_row), (baseline_key), temperature, top_p, top_k, logprobs_mode, head_width, and in a build with
    ``kl = "advantages"`` each side's logprob sum and whether it covers every token (lp_sum, lp_simple, ref_sum,
    ref_simple; :func:`_side_sums`)."""
    considered: int
    already_shipped: int
    drops: dict[str, int]
    current_version: int | None
    k: int | None
    reward_names_seen: list[str]
    constant_groups: int = 0


def _shipped_ids(out: str, prior: list[dict[str, Any]]) -> pa.Array | None:
    """The sample ids earlier sets in ``out`` shipped, as one Arrow string array (None when there are none):
    read column-wise from each set's ``sample_ids`` file, never as Python strings."""
    columns = [
        pq.read_table(os.path.join(out, m["set_id"], m["samples"]["file"]), columns=["sample_id"])
        .column("sample_id")
        .combine_chunks()
        .cast(pa.string())
        for m in prior
    ]
    columns = [c for c in columns if len(c)]
    return pa.concat_arrays(columns) if columns else None


def _plan(
    store: Store,
    versions: dict[str, int | None],
    options: ShardOptions,
    shipped: pa.Array | None,
    trace_spill: ScanSpill | None = None,
    ref_spill: ScanSpill | None = None,
) -> _Plan:
    """Scan, join, filter and pack (see the module docstring). With spills, the scans also keep the token
    columns of every row not shipped before, for the shards to be assembled from."""
    with_ref = options.kl != "none"
    names = list(options.rewards)
    exclude = shipped
    # the four reads are independent: run them side by side (decoding and polars release the GIL)
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            traces_f = pool.submit(_scan_plan_traces, store, versions["traces"], options, trace_spill, exclude)
            rewards_f = pool.submit(_latest_rewards, store, versions["rewards"], names)
            verdicts_f = pool.submit(_latest_verdicts, store, versions["checks"], options.tokenizer_fingerprint)
            refs_f = None
            if with_ref:
                refs_f = pool.submit(_scan_plan_refs, store, versions["ref_logprobs"], options, ref_spill, exclude)
            traces = traces_f.result()
            rewards, verdicts = rewards_f.result(), verdicts_f.result()
            refs = refs_f.result() if refs_f is not None else None
    finally:
        for spill in (trace_spill, ref_spill):
            if spill is not None:
                spill.close()
    if traces.is_empty():
        return _Plan(traces, 0, 0, {}, None, None, [])
    traces = traces.with_columns(pl.col("policy_version").str.extract(_VERSION_RE, 1).cast(pl.Int64).alias("_v"))
    current = parse_version(options.current_version) if options.current_version else traces["_v"].max()
    traces = traces.with_columns((pl.lit(current, dtype=pl.Int64) - pl.col("_v")).alias("staleness"))

    already = 0
    if shipped is not None:
        is_shipped = pl.Series(pc.is_in(traces["sample_id"].to_arrow(), value_set=shipped.cast(pa.large_string())))
        already = int(is_shipped.sum())
        traces = traces.filter(~is_shipped)

    plan = traces.join(rewards, on="sample_id", how="left").join(verdicts, on="sample_id", how="left")
    if refs is not None:
        plan = plan.join(refs, on="sample_id", how="left")
    plan = plan.sort("row")
    components = {n: plan[f"r::{n}"].to_numpy().astype(np.float64) for n in names}
    missing = np.zeros(plan.height, dtype=bool)
    for n in names:
        missing |= plan[f"r::{n}"].is_null().to_numpy()
    score = adv.combine_rewards(components, options.rewards)
    plan = plan.with_columns(pl.Series("score", np.where(missing, np.nan, score)), pl.Series("_score_missing", missing))
    plan = plan.with_columns(_drop_reasons(options, with_ref).alias("drop"))
    if with_ref and options.missing_ref == "error":
        lacking = plan.filter(pl.col("drop") == "missing_ref")
        if lacking.height:
            examples = ", ".join(lacking["sample_id"].head(3).to_list())
            raise UsageError(
                f"KL is requested (kl = {options.kl!r}) but {lacking.height} sample(s) have no reference logprobs"
                + (f" for ref_model {options.ref_model!r}" if options.ref_model else "")
                + f" (e.g. {examples}); ingest them with `prl ingest --kind ref`, set missing_ref = 'drop',"
                " or set kl = 'none'"
            )

    keep = plan.filter(pl.col("drop").is_null())
    constant = 0
    if options.drop_constant_groups and keep.height:
        gidx, num_g = adv.dense_index(keep["group_id"].to_arrow())
        const_G = adv.constant_groups(keep["score"].to_numpy(), gidx, num_g)
        constant = int(const_G.sum())
        const_N = const_G[gidx]
        const_rows = np.isin(plan["row"].to_numpy(), keep["row"].to_numpy()[const_N])
        plan = plan.with_columns(
            pl.when(pl.col("drop").is_null() & pl.Series(const_rows))
            .then(pl.lit("constant_group"))
            .otherwise(pl.col("drop"))
            .alias("drop")
        )
        keep = keep.filter(pl.Series(~const_N))
    counts = plan.group_by("drop").len().drop_nulls("drop")
    drops = {r: 0 for r in DROP_REASONS}
    drops.update(dict(zip(counts["drop"].to_list(), counts["len"].to_list(), strict=True)))
    drops = {k: v for k, v in drops.items() if v}

    k = None
    if options.topk == "auto" and keep.height:
        k = int(keep["head_width"].min())  # type: ignore[arg-type]
    elif isinstance(options.topk, int):
        k = options.topk
    if options.topk is not None and k is not None and k >= np.iinfo(np.int64).max:
        k = None  # heads present but no positions anywhere: nothing to fix

    ship = _pack(keep, options)
    seen = [n for n in names if plan[f"r::{n}"].is_not_null().any()]
    return _Plan(ship, plan.height + already, already, drops, current, k, seen, constant)


def _pack(keep: pl.DataFrame, options: ShardOptions) -> pl.DataFrame:
    """Order ``keep`` into shuffled whole groups and number the shards (``shard`` column)."""
    if keep.is_empty():
        return keep.with_columns(pl.lit(0, dtype=pl.Int32).alias("shard"))
    keep = keep.sort(["group_id", "sample_id"])
    gidx, num_g = adv.dense_index(keep["group_id"].to_arrow())  # sorted → group numbers increase with group_id
    perm_G = np.random.default_rng(options.seed).permutation(num_g)
    rank_G = np.empty(num_g, dtype=np.int64)
    rank_G[perm_G] = np.arange(num_g)
    tokens = (keep["prompt_len"] + keep["completion_len"]).to_numpy()
    group_tokens_G = np.bincount(gidx, weights=tokens, minlength=num_g)
    start_by_rank = np.concatenate(([0.0], np.cumsum(group_tokens_G[perm_G])[:-1]))
    window_G = (start_by_rank // options.target_tokens).astype(np.int64)[rank_G]
    order = np.lexsort((np.arange(len(gidx)), rank_G[gidx]))
    keep = keep[order]
    _, shard = np.unique(window_G[gidx][order], return_inverse=True)
    return keep.with_columns(pl.Series("shard", shard.astype(np.int32)))


# --- assembly ------------------------------------------------------------------------------------------------
def _list_array(
    values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType, valid: np.ndarray | None = None
) -> pa.ListArray:
    """A list array of ``values`` (flat, numpy) bounded by ``offsets`` (N + 1), nulls where ``valid`` is False.
    Bools are packed with numpy (Arrow packs a numpy bool array one value at a time)."""
    if value_type == pa.bool_() and valid is None:
        bits = pa.py_buffer(np.packbits(values, bitorder="little"))
        arr = pa.Array.from_buffers(pa.bool_(), len(values), [None, bits])
    else:
        arr = pa.array(values, type=value_type, mask=None if valid is None else ~valid)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), arr)


@dataclass
class _Scores:
    """Per shipped sample (final order): score after any KL penalty, advantage, group size; KL batch mean."""

    reward_N: np.ndarray
    advantage_N: np.ndarray
    group_size_N: np.ndarray
    mean_d: float
    kl_sum_N: np.ndarray | None
    kl_tokens_N: np.ndarray | None
    singleton_groups: int
    singletons_without_baseline: int


def _kl_inputs(
    lp: FlatList, ref: FlatList, mask: FlatList | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(lp_T, ref_T, mask_T, offsets_N1)`` of gathered rows that line up one to one (float32 as stored, NaN for
    nulls; :func:`prl.numerics.kl.log_ratio` widens them to float64 as it subtracts)."""
    return lp.filled(), ref.filled(), _mask_T(mask, lp.offsets_N1), lp.offsets_N1


def _token_counts(valid_T: np.ndarray, offsets_N1: np.ndarray) -> np.ndarray:
    """Number of True tokens per sample (int64)."""
    lengths_N = np.diff(offsets_N1)
    if valid_T.all():
        return lengths_N
    counts_N = np.zeros(len(lengths_N), dtype=np.int64)
    nonempty_N = lengths_N > 0
    if nonempty_N.any():
        counts_N[nonempty_N] = np.add.reduceat(valid_T, offsets_N1[:-1][nonempty_N], dtype=np.int64)
    return counts_N


def _blocks(offsets_N1: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges ``[r0, r1)`` cutting samples into blocks of about :data:`BLOCK_TOKENS` tokens (a longer sample
    is a block of its own)."""
    n = len(offsets_N1) - 1
    cuts = np.searchsorted(offsets_N1, np.arange(0, int(offsets_N1[-1]), BLOCK_TOKENS), side="right") - 1
    cuts = np.unique(np.concatenate((cuts[cuts < n], [n])))
    if cuts[0] != 0:
        cuts = np.concatenate(([0], cuts))
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))


def _kl_totals(
    trace_spill: ScanSpill,
    ref_spill: ScanSpill,
    plan: _Plan,
    bounds: np.ndarray,
    options: ShardOptions,
    todo_N: np.ndarray | None = None,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """A pass over the spilled rows, shard by shard (:data:`WORKERS` threads): ``(kl_sum_N, d_sum_N, count_N)``
    per shipped sample in final order: ``Σ_t k(d_t)`` (float64, only with ``kl = "reward"``), ``Σ_t d_t``
    (:func:`prl.numerics.kl.log_ratio_sums`) and the number of valid tokens. Only the samples marked in ``todo_N`` (all
    when None) are read; the others are left at 0. Every sum covers one sample alone, so nothing depends on the
    threads, the blocks or which other samples were read.
    """
    with_k = options.kl == "reward"
    n = plan.ship.height
    rows_N = plan.ship["row"].to_numpy()
    ref_rows_N = plan.ship["ref_row"].to_numpy()
    has_mask_N = plan.ship["has_mask"].to_numpy()
    kl_sum_N = np.zeros(n) if with_k else None
    d_sum_N = np.zeros(n)
    count_N = np.zeros(n, dtype=np.int64)

    def one(s: int) -> None:
        pick = np.arange(int(bounds[s]), int(bounds[s + 1]))
        if todo_N is not None:
            pick = pick[todo_N[pick]]
        if not len(pick):
            return
        traces = trace_spill.flat(rows_N[pick], ["completion_logprobs", *_mask_column(has_mask_N[pick])])
        refs = ref_spill.flat(ref_rows_N[pick], ["ref_logprobs"])
        lp_T, ref_T, mask_T, off = _kl_inputs(
            traces["completion_logprobs"], refs["ref_logprobs"], traces.get("completion_mask")
        )
        del traces, refs
        for r0, r1 in _blocks(off):
            t0, t1 = int(off[r0]), int(off[r1])
            off_b = off[r0 : r1 + 1] - t0
            rows = pick[r0:r1]
            if with_k:
                _, k_B, valid_B = klmod.masked_kl(lp_T[t0:t1], ref_T[t0:t1], mask_T[t0:t1], options.kl_estimator)
                kl_sum_N[rows] = klmod.segment_sum(k_B, off_b)  # type: ignore[index]
            else:
                _, valid_B = klmod.masked_log_ratio(lp_T[t0:t1], ref_T[t0:t1], mask_T[t0:t1])
            d_sum_N[rows] = klmod.log_ratio_sums(lp_T[t0:t1], ref_T[t0:t1], valid_B, off_b)
            count_N[rows] = _token_counts(valid_B, off_b)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        list(pool.map(one, range(len(bounds) - 1)))
    return kl_sum_N, d_sum_N, count_N


def _log_ratio_totals(
    trace_spill: ScanSpill, ref_spill: ScanSpill, plan: _Plan, bounds: np.ndarray, options: ShardOptions
) -> tuple[np.ndarray | None, np.ndarray, float, int]:
    """``(kl_sum_N, kl_tokens_N, Σd, count)`` over the valid tokens of the shipped samples (final order).

    With ``kl = "advantages"`` only the batch mean of ``d`` is needed, and the plan scans already summed each
    side of every sample whose tokens are all valid (``lp_sum``/``ref_sum``): only the other samples (a mask, a
    missing or non-finite logprob) are read again. Otherwise every sample is read again (:func:`_kl_totals`).
    The totals add the per-sample sums in final order.
    """
    todo_N = None
    if options.kl == "advantages":
        ship = plan.ship
        simple_N = (ship["lp_simple"] & ship["ref_simple"]).fill_null(False).to_numpy()
        todo_N = ~simple_N
    kl_sum_N, d_sum_N, count_N = _kl_totals(
        trace_spill, ref_spill, plan, bounds, options, None if todo_N is None or todo_N.all() else todo_N
    )
    if todo_N is not None:
        d_sum_N = np.where(simple_N, (ship["lp_sum"] - ship["ref_sum"]).to_numpy(), d_sum_N)
        count_N = np.where(simple_N, ship["completion_len"].to_numpy(), count_N)
    return kl_sum_N, count_N, float(d_sum_N.sum()), int(count_N.sum())


def _mask_column(has_mask_N: np.ndarray) -> list[str]:
    """``["completion_mask"]`` when one of the rows has a mask, else nothing to gather."""
    return ["completion_mask"] if has_mask_N.any() else []


def _mask_T(masks: FlatList | None, off: np.ndarray) -> np.ndarray:
    """``mask_T`` (bool, aligned to the completions bounded by ``off``): each row's ``completion_mask``, all True
    for rows without one (and for every row when ``masks`` is None); a null inside a mask is False."""
    if masks is None or (masks.row_valid_N is not None and not masks.row_valid_N.any()):
        return np.ones(int(off[-1]), dtype=bool)
    vals = masks.values_T if masks.valid_T is None else masks.values_T & masks.valid_T
    if masks.row_valid_N is None:
        return vals
    # rows with a mask: lengths equal completion lengths (checked in the plan), so their values fill exactly
    # those rows' positions, in order (a null row is empty in the gathered values)
    out = np.ones(int(off[-1]), dtype=bool)
    out[np.repeat(masks.row_valid_N, np.diff(off))] = vals
    return out


def _scores(ship: pl.DataFrame, options: ShardOptions, kl_sum_N, kl_tokens_N, d_sum: float, d_count: int):
    reward_N = ship["score"].to_numpy().astype(np.float64)
    if options.kl == "reward" and kl_sum_N is not None:
        reward_N = reward_N - options.kl_coef * kl_sum_N
    gidx, _ = adv.dense_index(ship["group_id"].to_arrow())
    if options.singleton_baseline == "batch":
        fallback = np.zeros(ship.height, dtype=np.int64)
    elif options.singleton_baseline == "none":
        fallback = None
    else:
        fallback, _ = adv.dense_index(ship["baseline_key"].to_arrow())
    result = adv.compute_advantages(reward_N, gidx, options.advantage, fallback)
    return _Scores(
        reward_N,
        result.advantages_N,
        result.group_size_N,
        d_sum / d_count if d_count else 0.0,
        kl_sum_N,
        kl_tokens_N,
        result.singleton_groups,
        result.singletons_without_baseline if fallback is not None else result.singleton_groups,
    )


INPUT_IDS = ("prompt_token_ids", "completion_token_ids")
"""The trace columns gathered as one row-wise concatenation: a shard's ``input_ids``."""


def _assemble(
    traces: dict[object, FlatList],
    nested: pa.Table | None,
    ref: FlatList | None,
    meta: pl.DataFrame,
    pos: slice,
    scores: _Scores,
    options: ShardOptions,
    k: int | None,
) -> tuple[pa.Table, float, int]:
    """One shard's Arrow table in ``SHARD`` schema, with the sum (float64) and count of its per-token KL values
    (0.0, 0 without KL). ``traces`` holds :data:`INPUT_IDS`, ``completion_logprobs`` and ``completion_mask`` of the
    shipped rows ``pos`` of the final order, ``nested`` their top-k heads (when ``k`` is set), ``ref`` their
    reference logprobs (with KL); ``meta`` is their rows of the plan."""
    ids = traces[INPUT_IDS]
    p_len, c_len = ids.part_lengths
    c_off = np.zeros(len(c_len) + 1, dtype=np.int64)
    np.cumsum(c_len, out=c_off[1:])
    mask_T = _mask_T(traces.get("completion_mask"), c_off)
    masked = not mask_T.all()
    with_kl = ref is not None
    into_adv = options.kl == "advantages"
    advantage_N = scores.advantage_N[pos]
    adv32_T = np.empty(len(mask_T), dtype=np.float32)
    if with_kl:
        lp_T, ref_T = traces["completion_logprobs"].filled(), ref.filled()  # type: ignore[union-attr]
        kl32_T = np.empty(len(mask_T), dtype=np.float32)
        valid_T = np.empty(len(mask_T), dtype=bool)
    for r0, r1 in _blocks(c_off):
        t0, t1 = int(c_off[r0]), int(c_off[r1])
        # float32 straight away unless the KL penalty is added in float64 first (the cast commutes with the
        # broadcast and with the 0/1 mask, so the stored values are the same either way)
        adv_B = klmod.broadcast(advantage_N[r0:r1].astype(np.float64 if into_adv else np.float32), c_off[r0 : r1 + 1])
        if masked:
            adv_B *= mask_T[t0:t1]
        if with_kl:
            mask_B = mask_T[t0:t1] if masked else None  # all True: nothing to combine
            d_B, k_B, valid_T[t0:t1] = klmod.masked_kl(lp_T[t0:t1], ref_T[t0:t1], mask_B, options.kl_estimator)
            kl32_T[t0:t1] = k_B
            if into_adv:  # into d's buffer: d is not needed afterwards
                adv_B = klmod.kl_into_token_advantages(
                    adv_B, d_B, valid_T[t0:t1], options.kl_coef, scores.mean_d, out=d_B
                )
        adv32_T[t0:t1] = adv_B
    rows = meta.height
    ref_col = kl_col = pa.nulls(rows, SHARD.field("kl").type)
    kl_tok_sum, kl_tok_n = 0.0, 0
    if with_kl:
        del lp_T, ref_T
        ref_col = ref.to_arrow(pa.float32())  # type: ignore[union-attr]
        kl_col = _list_array(kl32_T, c_off, pa.float32(), None if valid_T.all() else valid_T)
        kl_vals = pa.array(kl32_T[valid_T] if not valid_T.all() else kl32_T)
        kl_tok_sum = float(pc.sum(kl_vals).as_py() or 0.0)  # float32 values summed in float64
        kl_tok_n = len(kl_vals)
        del kl32_T, kl_vals
    if k is not None:
        assert nested is not None
        topk_ids = heads.fixed_k(nested["topk_ids"], k, heads.PAD_ID)
        topk_lps = heads.fixed_k(nested["topk_logprobs"], k, heads.PAD_LOGPROB)
    else:
        topk_ids = pa.nulls(rows, SHARD.field("topk_ids").type)
        topk_lps = pa.nulls(rows, SHARD.field("topk_logprobs").type)
    columns = {
        "sample_id": meta["sample_id"].to_arrow(),
        "group_id": meta["group_id"].to_arrow(),
        "policy_version": meta["policy_version"].to_arrow(),
        "staleness": meta["staleness"].to_arrow(),
        "input_ids": ids.to_arrow(pa.int32()),
        "prompt_len": pa.array(p_len.astype(np.int32)),
        "loss_mask": _list_array(mask_T, c_off, pa.bool_()),
        "behavior_logprobs": traces["completion_logprobs"].to_arrow(pa.float32()),
        "ref_logprobs": ref_col,
        "kl": kl_col,
        "token_advantages": _list_array(adv32_T, c_off, pa.float32()),
        "reward": pa.array(scores.reward_N[pos]),
        "advantage": pa.array(scores.advantage_N[pos]),
        "group_size": pa.array(scores.group_size_N[pos]),
        "topk_ids": topk_ids,
        "topk_logprobs": topk_lps,
    }
    arrays = []
    for f in SHARD:
        col = columns[f.name]
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks else pa.array([], f.type)
        arrays.append(col.cast(f.type) if col.type != f.type else col)
    return pa.Table.from_arrays(arrays, schema=SHARD), kl_tok_sum, kl_tok_n


def _write_shard(table: pa.Table, tmp: str) -> tuple[int, str]:
    """Write a shard's bytes to ``tmp`` (not yet fsynced; :func:`prl.shards.writer.write_shard`); returns its size
    in bytes and hex sha256, hashed as written."""
    return writer.write_shard(table, tmp)


def _write_samples(path: str, sample_ids: pa.Array) -> tuple[int, str]:
    """Write the set's sorted sample ids (fsynced, renamed into place); returns size and hex sha256."""
    sealed = writer.write_sample_ids(sample_ids.take(pc.sort_indices(sample_ids)), f"{path}.tmp")
    _publish_file(f"{path}.tmp", path)
    return sealed


def _count_plan(result: ShardResult, plan: _Plan, options: ShardOptions) -> None:
    """Copy the plan's counts into ``result`` and flag a drop rate above ``options.max_drop_rate``."""
    result.considered = plan.considered
    result.already_shipped = plan.already_shipped
    result.drops = plan.drops
    dropped = sum(plan.drops.values())
    denominator = plan.considered - plan.already_shipped
    result.drop_rate_exceeded = bool(
        options.max_drop_rate is not None and denominator and dropped / denominator > options.max_drop_rate
    )


# --- entry point ---------------------------------------------------------------------------------------------
def build_shards(
    store: Store,
    out: str,
    options: ShardOptions | None = None,
    rebuild: bool = False,
    dry_run: bool = False,
    lock: bool = True,
) -> ShardResult:
    """Build one shard set from ``store`` into ``out/<set-id>/`` (see the module docstring for the steps).

    Samples shipped by earlier sets in ``out`` are skipped unless ``rebuild``. ``dry_run`` plans and reports
    without writing anything. Unless ``dry_run`` (or ``lock=False``), the build holds the store's
    ``build-shards-<digest of OUT>`` lock (:func:`prl.store.locks.step_name`), so two builds into one ``OUT`` never
    overlap; a second one raises :class:`~prl.errors.LockedError`. Raises :class:`~prl.errors.UsageError` for
    bad options or missing inputs.
    """
    options = options or ShardOptions()
    if out.startswith("s3://") or "://" in out:
        raise UsageError(f"shard output must be a local folder for now, got {out!r}")
    out = os.path.abspath(out)
    with holding(store.uri, step_name("build-shards", out), enabled=lock and not dry_run):
        if not dry_run and os.path.isdir(out):
            _clean_stale_staging(out)  # leftovers of killed builds go first, even when nothing is new
        return _build_locked(store, out, options, rebuild, dry_run)


def _build_locked(store: Store, out: str, options: ShardOptions, rebuild: bool, dry_run: bool) -> ShardResult:
    versions = store.versions()
    if options.kl != "none" and versions.get("ref_logprobs") is None:
        raise UsageError(
            f"KL is requested (kl = {options.kl!r}) but the store has no ref_logprobs table; ingest reference "
            "logprobs with `prl ingest --kind ref` or set kl = 'none'"
        )
    result = ShardResult(out=out, status="nothing_new", source_versions=versions)
    if versions.get("traces") is None:
        return result

    prior = [] if rebuild else existing_sets(out)
    shipped = _shipped_ids(out, prior)
    digest = hashlib.sha256(
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "writer": writer.WRITER,  # the same inputs make the same bytes with the same writer
                "versions": versions,
                "options": options.to_dict(),
                "excluded_sets": sorted(m["set_id"] for m in prior),
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()
    set_id = f"v{versions['traces']}-{digest[:12]}"
    with_ref = options.kl != "none"
    needs_global_kl = options.kl in ("reward", "advantages")

    if dry_run:
        plan = _plan(store, versions, options, shipped)
        _count_plan(result, plan, options)
        if not plan.ship.is_empty():
            result.status = "dry_run"
            result.set_id = set_id
            result.rows = plan.ship.height
            result.tokens = int((plan.ship["prompt_len"] + plan.ship["completion_len"]).sum())
        scores = None if plan.ship.is_empty() else _scores(plan.ship, options, None, None, 0.0, 0)
        result.statistics = _statistics(plan, scores, options)
        return result

    made_out = not os.path.isdir(out)
    os.makedirs(out, exist_ok=True)
    staging = os.path.join(out, f".staging-{set_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(staging)
    try:
        spill_dir = os.path.join(staging, "_spill")
        os.makedirs(spill_dir)
        trace_spill = ScanSpill(os.path.join(spill_dir, "traces.arrow"))
        ref_spill = ScanSpill(os.path.join(spill_dir, "ref_logprobs.arrow")) if with_ref else None
        plan = _plan(store, versions, options, shipped, trace_spill, ref_spill)
        ship = plan.ship
        _count_plan(result, plan, options)
        if ship.is_empty():
            shutil.rmtree(staging)
            if made_out:
                os.rmdir(out)
            result.statistics = _statistics(plan, None, options)
            return result
        n_ship = ship.height
        expected = ship["sample_id"].to_arrow().cast(pa.string())
        shard_N = ship["shard"].to_numpy()
        bounds = np.searchsorted(shard_N, np.arange(int(shard_N[-1]) + 2))  # shards are runs of the final order
        kl_sum_N = kl_tokens_N = None
        d_sum, d_count = 0.0, 0
        if needs_global_kl:
            assert ref_spill is not None
            kl_sum_N, kl_tokens_N, d_sum, d_count = _log_ratio_totals(trace_spill, ref_spill, plan, bounds, options)
        scores = _scores(ship, options, kl_sum_N, kl_tokens_N, d_sum, d_count)

        with ThreadPoolExecutor(max_workers=IO_THREADS) as io:
            samples = io.submit(_write_samples, os.path.join(staging, SAMPLES_FILE), expected)
            shard_entries, kl_tok_sum, kl_tok_n = _write_shards(
                staging, trace_spill, ref_spill, plan, bounds, scores, options, io, spill_dir
            )
            samples_size, samples_sha256 = samples.result()
        shutil.rmtree(spill_dir, ignore_errors=True)  # gone already, unless a shard failed

        statistics = _statistics(plan, scores, options)
        if with_ref:
            statistics["kl"] = {
                "estimator": options.kl_estimator,
                "placement": options.kl,
                "coef": options.kl_coef,
                "mean_per_token": kl_tok_sum / kl_tok_n if kl_tok_n else None,
                "tokens": kl_tok_n,
                "mean_log_ratio": scores.mean_d if needs_global_kl else None,
            }
        manifest = {
            "format": "prl.shards",
            "schema_version": SCHEMA_VERSION,
            "set_id": set_id,
            "columns": SHARD.names,
            "options": options.to_dict(),
            "options_sha256": options.digest(),
            "source": {"versions": versions, "current_version": plan.current_version},
            "excluded_sets": sorted(m["set_id"] for m in prior),
            "shuffle": {"seed": options.seed, "unit": "group", "target_tokens": options.target_tokens},
            "shards": shard_entries,
            "samples": {"file": SAMPLES_FILE, "rows": n_ship, "bytes": samples_size, "sha256": samples_sha256},
            "totals": {
                "rows": n_ship,
                "groups": int(ship["group_id"].n_unique()),
                "tokens": sum(e["tokens"] for e in shard_entries),
                "completion_tokens": sum(e["completion_tokens"] for e in shard_entries),
                "shards": len(shard_entries),
            },
            "heads": _heads_info(ship, plan.k),
            "statistics": statistics,
            "drops": plan.drops,
            "conventions": {
                "input_ids": "prompt + completion",
                "completion_aligned": [
                    "loss_mask",
                    "behavior_logprobs",
                    "ref_logprobs",
                    "kl",
                    "token_advantages",
                    "topk_ids",
                    "topk_logprobs",
                ],
                "token_advantages": "advantage on loss_mask tokens, 0 elsewhere"
                + (" , plus kl_coef·(mean_log_ratio − d_t) on valid tokens" if options.kl == "advantages" else ""),
                "kl": "per-token estimate; null where the token is outside loss_mask or a logprob is missing",
                "behavior_logprobs": "as sampled; null where the server gave none (never 0.0)",
            },
        }
        _write_json(os.path.join(staging, MANIFEST), manifest)
        _fsync_dir(staging)
        final = os.path.join(out, set_id)
        if os.path.exists(final):
            trash = os.path.join(out, f".trash-{set_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            os.replace(final, trash)
            os.replace(staging, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(staging, final)
        _fsync_dir(out)
        _write_index(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise

    result.status = "built"
    result.set_id = set_id
    result.set_dir = final
    result.rows = n_ship
    result.tokens = manifest["totals"]["tokens"]
    result.shards = shard_entries
    result.statistics = statistics
    return result


def _write_shards(
    staging: str,
    trace_spill: ScanSpill,
    ref_spill: ScanSpill | None,
    plan: _Plan,
    bounds: np.ndarray,
    scores: _Scores,
    options: ShardOptions,
    io: ThreadPoolExecutor,
    spill_dir: str,
) -> tuple[list[dict[str, Any]], float, int]:
    """Assemble and write every shard: ``(manifest entries, Σ per-token KL, KL token count)``, in shard order.

    Shard ``s`` holds the shipped rows ``bounds[s]:bounds[s + 1]`` of the final order. Each shard is gathered
    from the spill files, assembled, and written and hashed (zstd, :mod:`prl.shards.writer`) by one of
    :data:`WORKERS` threads; numpy, Arrow, zstd and hashlib release the GIL for the heavy parts, so shards proceed side
    by side and at most :data:`WORKERS` shards are in memory at once. Each written file is then fsynced and
    renamed into place on ``io``, so that waiting for the disk overlaps the next shard's work, and once every
    shard has been gathered, ``spill_dir`` is removed there too. Each shard is computed on its own, so the
    bytes do not depend on the threads.
    """
    to_gather = [len(bounds) - 1]
    counting = threading.Lock()

    def gathered() -> None:
        with counting:
            to_gather[0] -= 1
            if to_gather[0] == 0:
                io.submit(shutil.rmtree, spill_dir, ignore_errors=True)

    rows_N = plan.ship["row"].to_numpy()
    ref_rows_N = plan.ship["ref_row"].to_numpy() if ref_spill is not None else None
    has_mask_N = plan.ship["has_mask"].to_numpy()

    def one(s: int) -> tuple[dict[str, Any], Future[None], float, int]:
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        columns = [INPUT_IDS, "completion_logprobs", *_mask_column(has_mask_N[lo:hi])]
        traces = trace_spill.flat(rows_N[lo:hi], columns)
        nested = trace_spill.gather(rows_N[lo:hi], list(HEAD_COLUMNS)) if plan.k is not None else None
        ref = None
        if ref_spill is not None:
            ref = ref_spill.flat(ref_rows_N[lo:hi], ["ref_logprobs"])["ref_logprobs"]  # type: ignore[index]
        gathered()
        meta = plan.ship.slice(lo, hi - lo)
        shard, kl_sum, kl_n = _assemble(traces, nested, ref, meta, slice(lo, hi), scores, options, plan.k)
        del traces, nested, ref
        name = f"part-{s:05d}.parquet"
        path = os.path.join(staging, name)
        size_sha256 = _write_shard(shard, f"{path}.tmp")
        sealed = io.submit(_publish_file, f"{path}.tmp", path)
        entry = {
            "file": name,
            "rows": shard.num_rows,
            "groups": int(meta["group_id"].n_unique()),
            "tokens": int(pc.sum(pc.list_value_length(shard["input_ids"])).as_py() or 0),
            "completion_tokens": int(pc.sum(pc.list_value_length(shard["loss_mask"])).as_py() or 0),
        }
        entry["bytes"], entry["sha256"] = size_sha256
        return entry, sealed, kl_sum, kl_n

    entries: list[dict[str, Any]] = []
    kl_tok_sum, kl_tok_n = 0.0, 0
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        written = list(pool.map(one, range(len(bounds) - 1)))
    for entry, sealed, kl_sum, kl_n in written:
        sealed.result()
        entries.append(entry)
        kl_tok_sum += kl_sum
        kl_tok_n += kl_n
    return entries, kl_tok_sum, kl_tok_n


def _heads_info(ship: pl.DataFrame, k: int | None) -> dict[str, Any]:
    def distinct(col: str) -> list[Any]:
        values = ship[col].unique().sort(nulls_last=True).to_list()
        return [float(v) if isinstance(v, float) else v for v in values]

    return {
        "k": k,
        "pad_id": heads.PAD_ID,
        "pad_logprob": "-inf",
        "convention": "first k entries per position (sorted descending); rows narrower than k never ship",
        "sampling": {
            "temperature": distinct("temperature"),
            "top_p": distinct("top_p"),
            "top_k": distinct("top_k"),
            "logprobs_mode": distinct("logprobs_mode"),
        },
    }


def _statistics(plan: _Plan, scores: _Scores | None, options: ShardOptions) -> dict[str, Any]:
    ship = plan.ship
    stats: dict[str, Any] = {
        "considered": plan.considered,
        "already_shipped": plan.already_shipped,
        "shipped": ship.height,
        "dropped": sum(plan.drops.values()),
        "drops": plan.drops,
        "reward_names_seen": plan.reward_names_seen,
        "constant_groups_dropped": 0,
    }
    if ship.height:
        stats["prompt_len"] = _summary(ship["prompt_len"].to_numpy())
        stats["completion_len"] = _summary(ship["completion_len"].to_numpy())
        stats["staleness"] = _summary(ship["staleness"].to_numpy().astype(np.float64))
        stats["score"] = _summary(ship["score"].to_numpy())
    if scores is not None:
        stats["reward"] = _summary(scores.reward_N)
        stats["advantage"] = _summary(scores.advantage_N)
        stats["group_size"] = _summary(scores.group_size_N)
        stats["groups_of_one"] = scores.singleton_groups
        stats["groups_of_one_fell_back"] = scores.singleton_groups - scores.singletons_without_baseline
        stats["groups_of_one_without_baseline"] = scores.singletons_without_baseline
        stats["singleton_baseline"] = options.singleton_baseline
    if options.drop_constant_groups and "constant_group" in plan.drops:
        stats["constant_samples_dropped"] = plan.drops["constant_group"]
        stats["constant_groups_dropped"] = plan.constant_groups
    return stats
