"""The frontier a build leaves (:mod:`prl.shards.frontier`): made from its plan once the build (or one of its turns,
:mod:`prl.shards.turns`) completed."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from prl.shards.frontier import (
    BACKLOG_SCHEMA,
    Frontier,
    TraceSource,
    new_backlog_name,
    options_digest,
    write_frontier,
)
from prl.shards.options import ShardOptions
from prl.shards.plan import Plan


def advance_frontier(
    out: str,
    versions: dict[str, int | None],
    options: ShardOptions,
    plan: Plan,
    shipped: int,
    source: TraceSource,
    prior: list[str],
    set_id: str | None,
) -> tuple[Frontier, pa.Table] | None:
    """After a build of ``out`` completed, ``shipped`` samples shipped into ``set_id`` (None: nothing shipped): the
    frontier for the next one (:mod:`prl.shards.frontier`) and its backlog, written to ``out`` unless ``out`` holds
    no set yet (a first build that shipped nothing leaves no folder and no objects). While files are pending, the
    frontier accounts only for the sets the source did and this one: the pending files are still to be read
    with the samples of the other earlier sets left out."""
    traces_version = versions.get("traces")
    if traces_version is None or (plan.backlog is None and not source.pending):
        return None  # nothing scanned: the frontier there is stays right
    made = [set_id] if set_id is not None else []
    sets = [*source.covered_sets, *made] if source.pending else [*prior, *made]
    excluded = [s for s in prior if s not in sets] if source.pending else []
    frontier = Frontier(
        traces_version=traces_version,
        options=options_digest(options),
        sets=tuple(sets),
        shipped=plan.already_shipped + shipped,
        version_max=plan.version_max,
        backlog=new_backlog_name(),
        pending=source.pending,
        excluded=tuple(excluded),
    )
    if plan.backlog is None:
        backlog = BACKLOG_SCHEMA.empty_table()
    else:
        frame = plan.backlog.with_columns(pl.col("_file").cast(pl.String).alias("file")).select("sample_id", "file")
        backlog = frame.to_arrow().cast(BACKLOG_SCHEMA)
    if [*prior, *made]:
        write_frontier(out, frontier, backlog)
    return frontier, backlog


__all__ = ["advance_frontier"]
