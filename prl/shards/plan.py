"""The plan of a build: which samples ship, in which order and shard, and why the others do not (docs/design.md).

:func:`make_plan` runs the plan scans (:mod:`prl.shards.scan`; the side reads, then the traces scan, in turn),
leaves out samples an earlier set in ``OUT`` shipped, joins the latest reward per component, verdict and
reference row, scores each sample, and names each dropped sample's first failed filter (:data:`DROP_REASONS`, in
order). :func:`pack` then sorts the groups, shuffles them with ``options.seed`` and lays them out back to back: a
group belongs to the shard in whose ``target_tokens`` window its first token falls, so groups stay whole and shards
hold about ``target_tokens`` tokens; within a group, samples follow ``sample_id``. Each shard is a run of the
final order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from prl.errors import UsageError
from prl.numerics import advantages as adv
from prl.runtime import release_free_memory
from prl.shards.frontier import TraceSource
from prl.shards.layout import set_ref
from prl.shards.merge_build import mark_units
from prl.shards.options import VERSION_RE, ShardOptions, parse_version
from prl.shards.scan import latest_rewards, latest_verdicts, scan_refs, scan_traces, source_sample_ids
from prl.shards.spill import ScanSpill
from prl.shards.writer import read_ipc
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
    "check_reason",
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
assert len(DROP_REASONS) <= 255, "a drop reason is a UInt8 code"


def drop_code(reason: str) -> pl.Expr:
    """The ``drop`` value of ``reason``: its place in :data:`DROP_REASONS` (UInt8)."""
    return pl.lit(DROP_REASONS.index(reason), dtype=pl.UInt8)


def drop_reasons(options: ShardOptions, with_ref: bool) -> pl.Expr:
    """One expression giving each sample's first failed filter as its :func:`drop_code` (null when it passes them
    all): one byte per sample, where the reason's name would be a string per sample."""
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
    if o.dropped_checks:
        rules.append(("check_reason", c("reasons").list.eval(pl.element().is_in(list(o.dropped_checks))).list.any()))
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
        expr = expr.when(cond.fill_null(False)).then(drop_code(name))
    return expr.otherwise(pl.lit(None, dtype=pl.UInt8))


@dataclass
class Plan:
    """The shipped samples in final order, with their shard numbers, and what was dropped."""

    ship: pl.DataFrame
    """Columns: row, sample_id, group_id, policy_version, policy_step, policy_version_spans, staleness, prompt_len, completion_len, has_mask, score,
    shard, (ref_row), (baseline_key), temperature, top_p, top_k, logprobs_mode, head_width, and in a build with
    ``kl = "advantages"`` each side's logprob sum and whether it covers every token (lp_sum, lp_simple, ref_sum,
    ref_simple; :func:`prl.shards.scan.side_sums`); with ``merge_turns`` one row per turn, with its unit (unit,
    unit_first, unit_pos; :func:`prl.shards.merge_build.mark_units`) and the unit's group_id and score. The
    columns only the filters read (:func:`plan_only`) are left out."""
    considered: int
    already_shipped: int
    drops: dict[str, int]
    current_version: int | None
    k: int | None
    reward_names_seen: list[str]
    constant_groups: int = 0
    backlog: pl.DataFrame | None = None
    """``sample_id``, ``_file`` of every considered row that does not ship (for the next build's frontier)."""
    version_max: int | None = None
    """The newest policy step of every traces row (shipped before or not)."""
    scanned: int = 0
    """Traces rows the scan read (all rows of the table, or a frontier's backlog and new files)."""
    scan: str = "whole"
    """``whole`` (the table at the pinned version) or ``frontier`` (:mod:`prl.shards.frontier`)."""
    check_reasons: dict[str, int] = field(default_factory=dict)
    """Shipped samples per check reason (:data:`prl.verdicts.REASONS`; the ``note`` reasons a build keeps)."""
    dropped_before: int | None = None
    """Of the samples dropped, those an earlier build (or turn) of this OUT considered and did not ship either
    (its frontier's backlog); None when that is not known (a whole scan)."""


def plan_only(options: ShardOptions) -> list[str]:
    """Columns of the plan frame that only the filters and the drop counts read, left out of :attr:`Plan.ship`
    (they would be held per shipped sample while the shards are written)."""
    only = [
        "_file",
        "finish_reason",
        "mask_len",
        "_v",
        "verdict",
        "reasons",
        "prefix_status",
        "_score_missing",
        "drop",
        "ref_len",
    ]
    return only + [f"r::{n}" for n in options.rewards]


def _samples_path(out: str, set_id: str) -> str:
    ref = set_ref(out, set_id)
    if ref is None:
        raise FileNotFoundError(f"shard set {set_id} of {out} is gone")
    return ref.samples_path


def shipped_ids(out: str, prior: list[str]) -> pa.Array | None:
    """The sample ids the earlier sets ``prior`` (ids) of ``out`` shipped, as one Arrow string array (None when
    there are none): read column-wise from each set's ``sample_ids`` file, never as Python strings."""
    columns = [
        read_ipc(_samples_path(out, set_id), columns=["sample_id"])
        .column("sample_id")
        .combine_chunks()
        .cast(pa.string())
        for set_id in prior
    ]
    columns = [c for c in columns if len(c)]
    return pa.concat_arrays(columns) if columns else None


@dataclass
class _Inputs:
    """What the plan scans read: per-sample trace scalars, latest rewards and verdicts, winning reference rows."""

    traces: pl.DataFrame
    rewards: pl.DataFrame
    verdicts: pl.DataFrame
    refs: pl.DataFrame | None


def _read_inputs(
    store: Store,
    versions: dict[str, int | None],
    options: ShardOptions,
    exclude: pa.Array | None,
    trace_spill: ScanSpill | None,
    ref_spill: ScanSpill | None,
    source: TraceSource | None = None,
) -> _Inputs:
    """The side reads (:func:`_read_sides`: rewards, verdicts and, with KL, the reference rows) one after the
    other, then the traces scan; the spills are closed when they end, however they end. When ``source`` is a
    frontier's (not the whole traces table), the side reads keep only rows of the samples it holds
    (:func:`prl.shards.scan.source_sample_ids`: its ``sample_id`` column alone, read first).

    Nothing runs side by side: each read's working memory (a side read's key columns, sorted whole; the traces
    scan's decoded batches) grows with the samples read, and run side by side they would add up. In turn, with
    the freed pages handed back in between, the peak is that of the largest read beside what the reads before
    it keep: the side reads keep a few columns per sample, the traces scan many more, so it goes last."""
    try:
        only = None
        if source is not None and not source.whole:
            only = source_sample_ids(source, store.scan_options)
        sides = _read_sides(store, versions, options, ref_spill, exclude, only)
        del only
        release_free_memory()  # what the side reads freed: not held beside the traces scan
        traces = scan_traces(store, versions["traces"], options, trace_spill, exclude, source)
        return _Inputs(traces, *sides)
    finally:
        for spill in (trace_spill, ref_spill):
            if spill is not None:
                spill.close()


def _read_sides(
    store: Store,
    versions: dict[str, int | None],
    options: ShardOptions,
    ref_spill: ScanSpill | None,
    exclude: pa.Array | None,
    only: pa.Array | None,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame | None]:
    """``(rewards, verdicts, refs)``: the latest rewards and verdicts and the winning reference rows (None
    without KL), read in turn, each read's freed pages handed back before the next."""
    rewards = latest_rewards(store, versions["rewards"], list(options.rewards), only)
    release_free_memory()
    verdicts = latest_verdicts(
        store, versions["checks"], options.tokenizer_fingerprint, only, options.merge_turns, reasons=True
    )
    refs = None
    if options.kl != "none":
        release_free_memory()
        refs = scan_refs(store, versions["ref_logprobs"], options, ref_spill, exclude, only)
    return rewards, verdicts, refs


def _with_staleness(
    traces: pl.DataFrame, options: ShardOptions, seen_max: int | None
) -> tuple[pl.DataFrame, int | None, int | None]:
    """``traces`` with ``staleness = current − version``, the current version (the option, else the newest of
    ``traces`` and ``seen_max``, the newest of rows not scanned) and the newest version of all rows."""
    traces = traces.with_columns(
        pl.col("policy_version").str.extract(VERSION_RE, 1).cast(pl.Int64, strict=False).alias("_v")
    )
    traces = traces.with_columns(pl.col("_v").alias("policy_step"))
    scanned_max = traces["_v"].max()
    newest = [int(v) for v in (scanned_max, seen_max) if isinstance(v, int)]
    version_max = max(newest) if newest else None
    current = parse_version(options.current_version) if options.current_version else version_max
    traces = traces.with_columns((pl.lit(current, dtype=pl.Int64) - pl.col("_v")).alias("staleness"))
    return traces, current, version_max


def _aligned(ids: pa.Array, side: pl.DataFrame) -> list[pl.Series]:
    """The columns of ``side`` (one row per non-null ``sample_id``) other than ``sample_id``, aligned to the trace
    rows whose sample ids are ``ids`` (null where a sample has no row there, or for a null id): each trace row's
    side row is looked up in Arrow (``index_in``: one hash table of the side's keys, in Arrow's pool, which
    :func:`prl.runtime.release_free_memory` hands back), then one gather per column, so that the trace columns
    are never copied and no joined frame is made."""
    if side.is_empty():
        index = pl.Series(pa.nulls(len(ids), pa.int32()))
    else:
        keys = side.get_column("sample_id").to_arrow()
        index = pl.Series(pc.index_in(ids, value_set=keys, skip_nulls=True))
    return [column.gather(index) for column in side.drop("sample_id").get_columns()]


def _scored(inputs: _Inputs, traces: pl.DataFrame, options: ShardOptions) -> pl.DataFrame:
    """One row per considered sample (scan order) with its joins, ``score`` and first failed filter ``drop``. The
    side frames of ``inputs`` are emptied once their columns are aligned to the trace rows (``refs`` becomes
    None), so that they are not held beside the scores and the filters."""
    with_ref = inputs.refs is not None
    sides = [inputs.rewards, inputs.verdicts] + ([inputs.refs] if inputs.refs is not None else [])
    ids = traces.get_column("sample_id").to_arrow()
    plan = traces.hstack([column for side in sides for column in _aligned(ids, side)])
    del ids, sides
    inputs.rewards, inputs.verdicts, inputs.refs = inputs.rewards.clear(), inputs.verdicts.clear(), None
    release_free_memory()  # the lookups' hash tables and the side frames (aligned now): not held beside the filters
    names = list(options.rewards)
    components = {n: plan[f"r::{n}"].to_numpy().astype(np.float64) for n in names}
    missing = np.zeros(plan.height, dtype=bool)
    for n in names:
        missing |= plan[f"r::{n}"].is_null().to_numpy()
    score = adv.combine_rewards(components, options.rewards)
    plan = plan.with_columns(pl.Series("score", np.where(missing, np.nan, score)), pl.Series("_score_missing", missing))
    plan = plan.with_columns(drop_reasons(options, with_ref).alias("drop"))
    if with_ref and options.missing_ref == "error":
        _refuse_missing_refs(plan, options)
    return plan


def _refuse_missing_refs(plan: pl.DataFrame, options: ShardOptions) -> None:
    """With ``missing_ref = "error"``: a :class:`UsageError` naming a few samples that lack reference logprobs."""
    lacking = plan.filter(pl.col("drop") == drop_code("missing_ref"))
    if lacking.height:
        examples = ", ".join(lacking["sample_id"].head(3).to_list())
        raise UsageError(
            f"KL is requested (kl = {options.kl!r}) but {lacking.height} sample(s) have no reference logprobs"
            + (f" for ref_model {options.ref_model!r}" if options.ref_model else "")
            + f" (e.g. {examples}); ingest them with `prl ingest --kind ref`, set missing_ref = 'drop',"
            " or set kl = 'none'"
        )


def _drop_constant_groups(plan: pl.DataFrame, kept_K: np.ndarray) -> tuple[pl.DataFrame, np.ndarray, int]:
    """Mark the kept samples (``kept_K``: plan rows, ascending) of constant-score groups ``constant_group``:
    ``(plan, the plan rows still kept, groups dropped)``. Only the group and score columns of the kept rows are
    gathered."""
    keys = plan.select("group_id", "score")[kept_K]
    gidx, num_g = adv.dense_index(keys["group_id"].to_arrow())
    const_G = adv.constant_groups(keys["score"].to_numpy(), gidx, num_g)
    const_K = const_G[gidx]
    const_rows = np.zeros(plan.height, dtype=bool)
    const_rows[kept_K[const_K]] = True
    plan = plan.with_columns(
        pl.when(pl.col("drop").is_null() & pl.Series(const_rows))
        .then(drop_code("constant_group"))
        .otherwise(pl.col("drop"))
        .alias("drop")
    )
    return plan, kept_K[~const_K], int(const_G.sum())


def _check_reasons(plan: pl.DataFrame, kept_K: np.ndarray) -> dict[str, int]:
    """Shipped samples per check reason (``note`` reasons mostly: a sample with a ``drift`` or ``invalid``
    reason does not ship), reasons with none left out, by name."""
    if not len(kept_K) or "reasons" not in plan.columns:
        return {}
    counts = plan.select("reasons")[kept_K].explode("reasons").drop_nulls().group_by("reasons").len()
    return {str(k): int(v) for k, v in sorted(counts.rows())}


def _drop_counts(plan: pl.DataFrame) -> dict[str, int]:
    """Samples per drop reason, in :data:`DROP_REASONS` order, reasons with none left out."""
    counts = plan.group_by("drop").len().drop_nulls("drop")
    found = dict(zip(counts["drop"].to_list(), counts["len"].to_list(), strict=True))
    return {r: int(found[i]) for i, r in enumerate(DROP_REASONS) if found.get(i)}


def _head_k(widths: pl.Series | None, options: ShardOptions) -> int | None:
    """k of the shipped heads: the option, or with ``auto`` the narrowest of ``widths`` (the head widths of the
    rows kept; None without heads)."""
    k = None
    if options.topk == "auto" and widths is not None and len(widths):
        k = int(widths.min())  # type: ignore[arg-type]
    elif isinstance(options.topk, int):
        k = options.topk
    if options.topk is not None and k is not None and k >= np.iinfo(np.int64).max:
        k = None  # heads present but no positions anywhere: nothing to fix
    return k


def make_plan(
    store: Store,
    versions: dict[str, int | None],
    options: ShardOptions,
    shipped: pa.Array | None,
    trace_spill: ScanSpill | None = None,
    ref_spill: ScanSpill | None = None,
    source: TraceSource | None = None,
) -> Plan:
    """Scan, join, filter and pack (see the module docstring). With spills, the scans also keep the token
    columns of every row not shipped before (``shipped``), for the shards to be assembled from. ``source`` is
    what the traces scan reads (:func:`prl.shards.frontier.trace_source`; default the whole table): a
    frontier's source leaves out rows shipped by the sets it accounts for, counted in ``source.shipped``."""
    inputs = _read_inputs(store, versions, options, shipped, trace_spill, ref_spill, source)
    release_free_memory()  # what the scans and the side reads freed: not held beside the joins
    before = source.shipped if source is not None else 0
    seen_max = source.version_max if source is not None else None
    scan = source.scan if source is not None else "whole"
    scanned = inputs.traces.height
    if inputs.traces.is_empty():
        current = parse_version(options.current_version) if options.current_version else seen_max
        known = None if source is None or source.backlog_ids is None else 0
        return Plan(
            inputs.traces, before, before, {}, current, None, [], version_max=seen_max, scan=scan, dropped_before=known
        )
    traces, current, version_max = _with_staleness(inputs.traces, options, seen_max)
    inputs.traces = traces.clear()  # `traces` alone holds the trace columns from here
    already = 0
    if shipped is not None:
        is_shipped = pl.Series(pc.is_in(traces["sample_id"].to_arrow(), value_set=shipped.cast(pa.large_string())))
        already = int(is_shipped.sum())
        traces = traces.filter(~is_shipped)
    plan = _scored(inputs, traces, options)
    del inputs, traces  # the side tables and trace columns: the plan frame holds what is left of them
    kept_K = np.flatnonzero(plan["drop"].is_null().to_numpy())
    constant = 0
    if options.drop_constant_groups and len(kept_K):
        plan, kept_K, constant = _drop_constant_groups(plan, kept_K)
    out = Plan(
        plan.clear(),
        plan.height + already + before,
        already + before,
        _drop_counts(plan),
        current,
        None,
        [n for n in options.rewards if plan[f"r::{n}"].is_not_null().any()],
        constant,
        plan.select("sample_id", "_file", "drop").filter(pl.col("drop").is_not_null()).drop("drop"),
        version_max,
        scanned,
        scan,
    )
    out.check_reasons = _check_reasons(plan, kept_K)
    out.dropped_before = _dropped_before(out.backlog, source)
    if options.merge_turns and len(kept_K):
        keep = mark_units(plan, plan[kept_K], options)
        out.k = _head_k(keep.get_column("head_width") if options.topk is not None else None, options)
        out.ship = pack(keep.drop(plan_only(options), strict=False), options)
        return out
    widths = plan.get_column("head_width").gather(kept_K) if options.topk is not None else None
    out.k = _head_k(widths, options)
    box = [plan]
    del plan  # the frame lives on in box alone, so that _shipped frees each column once it is gathered
    out.ship = _shipped(box, kept_K, options)
    return out


def _dropped_before(dropped: pl.DataFrame | None, source: TraceSource | None) -> int | None:
    """How many of the ``dropped`` rows (``sample_id``) the frontier's backlog holds (None without a frontier)."""
    if source is None or source.backlog_ids is None:
        return None
    if dropped is None or dropped.is_empty() or not len(source.backlog_ids):
        return 0
    ids = dropped["sample_id"].to_arrow()
    return int(pc.sum(pc.is_in(ids, value_set=source.backlog_ids.cast(ids.type))).as_py() or 0)


def _shipped(box: list[pl.DataFrame], kept_K: np.ndarray, options: ShardOptions) -> pl.DataFrame:
    """The plan rows ``kept_K`` (ascending) in final order with their shard numbers (:func:`pack`), taken out of
    the plan frame (``box``'s one item, taken out of it) a column at a time: each plan column is freed as soon
    as its shipped rows are gathered, so the plan and the shipped rows are never both held whole."""
    plan = box.pop()
    if not len(kept_K):
        return pack(plan.clear().drop(plan_only(options), strict=False), options)
    index_K, shard_K = _order(plan.select("group_id", "sample_id", "prompt_len", "completion_len")[kept_K], options)
    rows = pl.Series(kept_K[index_K])
    plan = plan.drop(plan_only(options), strict=False)
    columns = []
    for name in plan.columns:
        columns.append(plan.get_column(name).gather(rows))
        plan = plan.drop(name)
    return pl.DataFrame(columns).with_columns(pl.Series("shard", shard_K))


def pack(keep: pl.DataFrame, options: ShardOptions) -> pl.DataFrame:
    """Order ``keep`` into shuffled whole groups and number the shards (``shard`` column)."""
    if keep.is_empty():
        return keep.with_columns(pl.lit(0, dtype=pl.Int32).alias("shard"))
    index_K, shard_K = _order(keep, options)
    return keep[index_K].with_columns(pl.Series("shard", shard_K))


def _runs(sorted_keys: pl.Series) -> tuple[np.ndarray, int]:
    """Dense numbers (int64) of the runs of equal values of ``sorted_keys`` (not empty; nulls equal) and how many
    runs (polars' ``rle_id``): for sorted keys, what :func:`prl.numerics.advantages.dense_index` gives, without a
    hash table of them."""
    gidx = sorted_keys.rle_id().to_numpy().astype(np.int64)
    return gidx, int(gidx[-1]) + 1


def _order(keep: pl.DataFrame, options: ShardOptions) -> tuple[np.ndarray, np.ndarray]:
    """``(index_K, shard_K)``: the rows of ``keep`` (not empty) in final order, shuffled whole groups, and the
    shard (int32) of each row in that order. Only the key columns of ``keep`` are read: ``group_id``, then with
    merged turns ``unit_first``, ``unit_pos`` and ``row_tokens``, else ``sample_id``, ``prompt_len`` and
    ``completion_len``."""
    # merged turns: a unit's turns stay together and in order (prl.shards.merge_build)
    by = ["group_id", "unit_first", "unit_pos"] if "unit_pos" in keep.columns else ["group_id", "sample_id"]
    tokens_col = (
        pl.col("row_tokens") if "row_tokens" in keep.columns else pl.col("prompt_len") + pl.col("completion_len")
    )
    keys = keep.select(*by, tokens_col.alias("_tokens")).with_row_index("_k").sort(by)
    gidx, num_g = _runs(keys.get_column("group_id"))  # sorted → group numbers increase with group_id
    perm_G = np.random.default_rng(options.seed).permutation(num_g)  # the group at each rank
    group_tokens_G = np.bincount(gidx, weights=keys["_tokens"].to_numpy(), minlength=num_g)
    start_by_rank = np.concatenate(([0.0], np.cumsum(group_tokens_G[perm_G])[:-1]))
    window_by_rank = (start_by_rank // options.target_tokens).astype(np.int64)  # nondecreasing
    # each group is a run of the sorted keys: lay the runs out in rank order, each in its own order
    rows_G = np.bincount(gidx, minlength=num_g)
    first_G = np.concatenate(([0], np.cumsum(rows_G)[:-1]))
    rows_by_rank = rows_G[perm_G]
    placed_by_rank = np.concatenate(([0], np.cumsum(rows_by_rank)[:-1]))  # the rows laid out before each rank
    order = np.repeat(first_G[perm_G] - placed_by_rank, rows_by_rank)
    order += np.arange(len(order))
    shard_by_rank = np.concatenate(([0], np.cumsum(window_by_rank[1:] != window_by_rank[:-1])))  # windows, densely
    shard = np.repeat(shard_by_rank.astype(np.int32), rows_by_rank)
    return keys["_k"].to_numpy()[order], shard


__all__ = ["DROP_REASONS", "Plan", "drop_reasons", "make_plan", "pack", "plan_only", "shipped_ids"]
