"""A build's traces files in turns: at most ``max_set_samples`` considered rows per set.

A build holds per-sample state for every row it considers (the plan's frame, the side rows of its samples, the
spills' row starts: a few hundred bytes a sample), so one build over a large backlog (a first build of a store
that has been filling for months, or after ``--rebuild``) would hold it for every sample at once. With
``max_set_samples`` (:class:`prl.shards.options.ShardOptions`), a build takes the files it must read in turns:
the backlog of the last turn (always whole), then files in order (the frontier's pending files, then files
added since, each oldest first; or the snapshot's files) until their rows would pass the cap, always at least
one. It plans and publishes that set, records the rest as ``pending`` in the frontier
(:mod:`prl.shards.frontier`), and takes the next turn, until nothing is pending. Each set is what a cron run that
had seen only those files would have built: groups and trajectories split across a turn's cut ship in two
sets, as they do across cron runs. A data file is never split, so a turn holds at least one whole file (ingest
rolls files at 128 MiB).

Rows per file come from the Delta log's statistics (``num_records``), without reading any data; a file the log
gives no count for is counted from its Parquet footer. Staleness's "current" version is the newest of every
row of the snapshot, as without turns: the ``policy_version`` column of the files left pending is read (that
column alone, batch by batch) once, when they are first left pending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl
import pyarrow.dataset as ds

from prl.shards.options import VERSION_RE
from prl.store.changes import files_dataset
from prl.store.tables import Store


def _counted(store: Store, files: Sequence[str], known: Mapping[str, int]) -> list[int]:
    """Rows of each of ``files``: from ``known``, else from the file's Parquet footer."""
    missing = [f for f in files if f not in known]
    footers: dict[str, int] = {}
    if missing:
        dataset = files_dataset(store, "traces", missing)
        for path, fragment in zip(missing, dataset.get_fragments(), strict=True):
            assert isinstance(fragment, ds.ParquetFileFragment)
            footers[path] = fragment.metadata.num_rows
    return [known[f] if f in known else footers[f] for f in files]


def take(
    store: Store, files: Sequence[str], known: Mapping[str, int], budget: int | None
) -> tuple[list[str], list[str]]:
    """``(taken, pending)``: the first of ``files`` (in order) whose rows stay within ``budget`` (always at least
    one file when there is one), and the rest. No ``budget``: every file is taken."""
    if budget is None or not files:
        return list(files), []
    rows = _counted(store, files, known)
    total = 0
    for i, n in enumerate(rows):
        if i and total + n > budget:
            return list(files[:i]), list(files[i:])
        total += n
    return list(files), []


def newest_version(store: Store, files: Sequence[str]) -> int | None:
    """The newest policy step (the integer of ``policy_version``, as the plan reads it) of every row of ``files``
    (traces data files), reading that column alone, batch by batch; None when no row has one."""
    if not files:
        return None
    newest: int | None = None
    dataset = files_dataset(store, "traces", list(files))
    for batch in dataset.to_batches(columns=["policy_version"], fragment_scan_options=store.scan_options):
        if not batch.num_rows:
            continue
        steps = pl.Series(batch.column(0)).cast(pl.String).str.extract(VERSION_RE, 1).cast(pl.Int64, strict=False)
        top = steps.max()
        if isinstance(top, int) and (newest is None or top > newest):
            newest = top
    return newest


__all__ = ["newest_version", "take"]
