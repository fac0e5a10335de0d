"""The build frontier: what the last build left unshipped, so the next one reads new traces files, not history.

A build of ``OUT`` considers every trace row whose sample no set of ``OUT`` shipped. Without help that is a scan
of the whole ``traces`` table on every run, decoding every token of the store's history. After each build that
completes (a set published, or nothing to ship), ``.OUT.prl/frontier.json`` records:

- ``traces_version`` ``W``: the traces version the build read;
- ``backlog``: an Arrow IPC file (in ``.OUT.prl/frontier/``) of the ``sample_id`` of every considered row that did not ship (dropped for any
  reason: a later reward, verdict or reference row, or new group members, may let it ship) and the traces data
  file that holds it;
- ``sets``: the sets of ``OUT`` whose samples it accounts for; ``shipped``: how many rows of traces at ``W`` they
  shipped; ``version_max``: the newest policy step of traces at ``W`` (staleness's "current");
- ``options``: the digest of the build options (a build with other options ignores the frontier);
- ``pending``: traces files of the snapshot at ``W`` that a build taking turns (:mod:`prl.shards.turns`) has not
  read yet, oldest first (``version_max`` covers their rows already). While files are pending, ``sets`` names
  only the sets the turns accounted for, so the pending files are read with the samples of the other sets left
  out; those are named in ``excluded`` (one of them gone means a whole scan).

The next build then scans only the backlog's files (only the backlog's rows of them) plus the pending files and
those that traces commits after ``W`` added (:func:`prl.store.changes.added_files`; as many as ``max_set_samples``
lets one turn take), and leaves out the samples of sets published since the frontier was written. Within the
cap it considers exactly the rows a whole scan would leave after removing shipped samples, so its plan, and the
set it publishes, are the same bytes (``tests/test_shards_frontier.py`` asserts it).
Any doubt is a whole scan: no frontier, other options, ``--rebuild``, a set it accounts for gone, traces
re-created (version below ``W``), a commit file of the range cleaned up, or a backlog or pending file no longer in
the snapshot (``prl maintain`` compacted it); the build after that writes a fresh frontier.

A local ``OUT`` and an ``s3://`` OUT both keep a frontier, at the same keys (on S3 the backlog and then
``frontier.json`` are each put whole, :func:`write_frontier`, and read in one GET each). The reward, verdict
and reference reads still read their tables' key columns whole; they keep only rows of the considered samples.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from prl.io.locations import is_remote
from prl.shards.layout import meta_root
from prl.shards.options import ShardOptions
from prl.shards.publish import publish_file, write_json
from prl.shards.turns import newest_version, take
from prl.shards.writer import read_ipc, write_ipc
from prl.store.changes import added_files, files_dataset, snapshot_turn_files
from prl.store.tables import Store

FRONTIER = "frontier.json"
FRONTIER_FORMAT = 3
"""3: with ``pending`` (:mod:`prl.shards.turns`) and an Arrow IPC backlog; a frontier of another format is not
read (a whole scan instead)."""
BACKLOG_SCHEMA = pa.schema([("sample_id", pa.string()), ("file", pa.string())])
"""One row per unshipped considered trace row: its sample and the traces data file (relative to the table)."""


def options_digest(options: ShardOptions) -> str:
    """Hex sha256 of the build options (what decides which rows ship)."""
    return hashlib.sha256(json.dumps(options.to_dict(), sort_keys=True).encode()).hexdigest()


def frontier_path(out: str) -> str:
    return os.path.join(meta_root(out), FRONTIER)


def backlog_dir(out: str) -> str:
    return os.path.join(meta_root(out), "frontier")


@dataclass(frozen=True)
class Frontier:
    """``.OUT.prl/frontier.json`` (see the module docstring)."""

    traces_version: int
    options: str
    sets: tuple[str, ...]
    shipped: int
    version_max: int | None
    backlog: str
    """File name of the backlog (Arrow IPC, never Parquet), in ``.OUT.prl/frontier/``."""
    pending: tuple[str, ...] = ()
    """Traces data files of the snapshot at ``traces_version`` that no build has read yet (a build taking turns,
    :mod:`prl.shards.turns`), oldest first; ``version_max`` covers their rows already."""
    excluded: tuple[str, ...] = ()
    """While files are pending: the earlier sets of OUT whose samples the turns left out by id (not in ``sets``);
    one of them gone means a whole scan, as a set of ``sets`` gone does."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FRONTIER_FORMAT,
            "traces_version": self.traces_version,
            "options": self.options,
            "sets": list(self.sets),
            "shipped": self.shipped,
            "version_max": self.version_max,
            "backlog": self.backlog,
            "pending": list(self.pending),
            "excluded": list(self.excluded),
        }


def read_frontier(out: str) -> Frontier | None:
    """The frontier of ``out`` (a local folder or an ``s3://`` prefix), or None when there is none or it is not
    one this version of prl wrote."""
    try:
        if is_remote(out):
            from prl.shards.s3out import S3Out

            target = S3Out(out)
            body = target.read_if_any(target.mkey(FRONTIER))
            if body is None:
                return None
            raw = json.loads(body)
        else:
            with open(frontier_path(out), encoding="utf-8") as fh:
                raw = json.load(fh)
        if raw.get("format") != FRONTIER_FORMAT:
            return None
        version_max = raw["version_max"]
        if not isinstance(raw["pending"], list) or not isinstance(raw["excluded"], list):
            return None
        return Frontier(
            traces_version=int(raw["traces_version"]),
            options=str(raw["options"]),
            sets=tuple(str(s) for s in raw["sets"]),
            shipped=int(raw["shipped"]),
            version_max=None if version_max is None else int(version_max),
            backlog=os.path.basename(str(raw["backlog"])),
            pending=tuple(str(p) for p in raw["pending"]),
            excluded=tuple(str(s) for s in raw["excluded"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass
class TraceSource:
    """What a build's traces scan reads: pyarrow datasets over some traces files, each with an optional row filter.

    ``whole`` is True for the whole snapshot (no frontier applies, every file in one turn); then ``shipped`` (rows
    already shipped by the sets the frontier accounts for) is 0 and ``version_max`` None. ``pending``: the files of
    the snapshot left for later turns (:mod:`prl.shards.turns`); ``version_max`` then covers their rows too.
    ``scan``: ``whole`` or ``frontier``, what the build reports (``traces_scan.from``). ``backlog_ids``: with a
    frontier, the samples an earlier build (or turn) considered and did not ship; None for a whole scan."""

    parts: list[tuple[ds.Dataset, ds.Expression | None]]
    whole: bool
    shipped: int = 0
    version_max: int | None = None
    covered_sets: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    scan: str = "whole"
    backlog_ids: pa.Array | None = None


def whole_snapshot(store: Store, version: int, cap: int | None = None) -> TraceSource:
    """Every traces file at ``version``: in one turn when ``cap`` (``max_set_samples``) is None or not passed,
    else the first turn of them (:func:`prl.shards.turns.take`)."""
    if cap is not None:
        files, known = snapshot_turn_files(store, version)
        taken, pending = take(store, files, known, cap)
        if pending:
            newest = newest_version(store, pending)
            return TraceSource(
                [(files_dataset(store, "traces", taken), None)], False, 0, newest, pending=tuple(pending)
            )
    dataset = store.dataset("traces", version)
    return TraceSource([(dataset, None)] if dataset is not None else [], whole=True)


def trace_source(
    store: Store, out: str, version: int, options: ShardOptions, prior_sets: list[str], rebuild: bool
) -> TraceSource:
    """The traces rows a build of ``out`` must consider (before leaving out samples of sets the frontier does not
    account for): from the frontier when it applies, else the whole snapshot at ``version`` (its first turn, with
    ``max_set_samples``)."""
    cap = options.max_set_samples
    frontier = None if rebuild else read_frontier(out)
    if frontier is None or frontier.options != options_digest(options) or frontier.traces_version > version:
        return whole_snapshot(store, version, cap)
    if not set(frontier.sets) | set(frontier.excluded) <= set(prior_sets):
        return whole_snapshot(store, version, cap)
    backlog = _read_backlog(out, frontier.backlog)
    source = None if backlog is None else continued_source(store, version, frontier, backlog, cap)
    return whole_snapshot(store, version, cap) if source is None else source


def continued_source(
    store: Store, version: int, frontier: Frontier, backlog: pa.Table, cap: int | None
) -> TraceSource | None:
    """What the build after ``frontier`` (read from OUT, or the one a turn just made) reads at traces ``version``:
    the backlog's rows, then the pending files and those added since ``frontier.traces_version``, as many as the
    turn's ``cap`` takes (the backlog's rows count against it). None when the frontier cannot be followed (a
    commit file of the range cleaned up, a backlog or pending file no longer in the snapshot): a whole scan."""
    new_files = added_files(store, "traces", frontier.traces_version, version)
    if new_files is None:
        return None
    backlog_files = sorted(set(pc.unique(backlog.column("file")).to_pylist()))
    known: dict[str, int] = {}
    if backlog_files or frontier.pending or cap is not None:
        in_snapshot, known = snapshot_turn_files(store, version)  # one read of the snapshot's add actions
        if not set(backlog_files) <= set(in_snapshot) or not set(frontier.pending) <= set(in_snapshot):
            return None
    files = [*frontier.pending, *new_files]
    budget = None if cap is None else cap - backlog.num_rows
    taken, pending = take(store, files, known, budget)
    version_max = frontier.version_max
    unseen = files[max(len(taken), len(frontier.pending)) :]  # left pending, not yet in frontier.version_max
    newest = newest_version(store, unseen)
    if newest is not None and (version_max is None or newest > version_max):
        version_max = newest
    parts: list[tuple[ds.Dataset, ds.Expression | None]] = []
    ids = pc.unique(backlog.column("sample_id").combine_chunks())
    if backlog_files:
        parts.append((files_dataset(store, "traces", backlog_files), pc.field("sample_id").isin(ids)))
    if taken:
        parts.append((files_dataset(store, "traces", taken), None))
    sets = frontier.sets
    return TraceSource(parts, False, frontier.shipped, version_max, sets, tuple(pending), "frontier", ids)


def _read_backlog(out: str, name: str) -> pa.Table | None:
    """The backlog file ``name`` of ``out`` (on S3 in one GET), or None when it cannot be read."""
    try:
        if is_remote(out):
            from prl.shards.s3out import S3Out

            target = S3Out(out)
            body = target.read_if_any(target.mkey("frontier", name))
            return None if body is None else read_ipc(pa.py_buffer(body)).cast(BACKLOG_SCHEMA)
        return read_ipc(os.path.join(backlog_dir(out), name)).cast(BACKLOG_SCHEMA)
    except (OSError, pa.ArrowInvalid, ValueError):
        return None


def relative_file(store: Store, path: str) -> str:
    """A traces data file's path relative to the table folder, as the Delta log names it."""
    root = store.table_path("traces").rstrip("/") + "/"
    return path[len(root) :] if path.startswith(root) else path


def write_frontier(out: str, frontier: Frontier, backlog: pa.Table) -> None:
    """Write the backlog file, then ``frontier.json`` naming it (locally each fsynced and renamed into place; on
    S3 each one put), then remove earlier backlog files. A build killed in between leaves the earlier frontier,
    which stays correct."""
    if is_remote(out):
        _write_remote(out, frontier, backlog)
        return
    root = backlog_dir(out)
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, frontier.backlog)
    write_ipc(backlog.cast(BACKLOG_SCHEMA), f"{path}.tmp")
    publish_file(f"{path}.tmp", path)
    write_json(frontier_path(out), frontier.to_json())
    for name in os.listdir(root):
        if name.startswith("backlog-") and name != frontier.backlog:
            try:
                os.remove(os.path.join(root, name))
            except FileNotFoundError:
                pass


def _write_remote(out: str, frontier: Frontier, backlog: pa.Table) -> None:
    from prl.shards.s3out import S3Out

    target = S3Out(out)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, BACKLOG_SCHEMA, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(backlog.cast(BACKLOG_SCHEMA))
    folder = target.mkey("frontier")
    target.put(f"{folder}/{frontier.backlog}", sink.getvalue().to_pybytes())
    target.put(target.mkey(FRONTIER), json.dumps(frontier.to_json(), indent=2, sort_keys=True).encode())
    target.delete_under(f"{folder}/", keep=f"{folder}/{frontier.backlog}")


def new_backlog_name() -> str:
    return f"backlog-{uuid.uuid4().hex[:12]}.arrow"


__all__ = [
    "BACKLOG_SCHEMA",
    "Frontier",
    "TraceSource",
    "continued_source",
    "new_backlog_name",
    "options_digest",
    "read_frontier",
    "relative_file",
    "trace_source",
    "whole_snapshot",
    "write_frontier",
]
