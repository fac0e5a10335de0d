"""``prl build-shards``: checked traces + rewards (+ reference logprobs) → published Parquet shard sets.

:func:`build_shards` is the orchestration; each step is its own module (see :mod:`prl.shards`):

1. **Pin** the source: ``store.versions()`` is read once and every scan reads exactly those table versions.
2. **Plan** (:mod:`prl.shards.plan` over :mod:`prl.shards.scan`): per-sample scalars, joins, filters with drop
   reasons, samples already shipped by earlier sets in ``OUT`` left out (unless ``rebuild``), groups shuffled and
   packed into shards. The scans spill the token columns of every row not shipped before
   (:class:`prl.shards.spill.ScanSpill`), so token data is decoded once per build; a dry run spills nothing.
3. **Scores** (:mod:`prl.shards.scores`): KL sums or the batch mean log ratio where the options need them, then
   group-relative advantages over exactly the rows that ship.
4. **Assemble and write** (:mod:`prl.shards.parts`, :mod:`prl.shards.assemble`, :mod:`prl.shards.writer`):
   each shard's rows are gathered from the spill, assembled and written with pyarrow a row group at a time
   (:mod:`prl.shards.rowgroups`), hashed as written, fsynced and renamed into place: one task per shard on
   :data:`WORKERS` threads with the local engine, or where the engine puts them. Every value is computed per
   sample, so the bytes do not depend on the threads.
5. **Publish** (:mod:`prl.shards.target`; layout in :mod:`prl.shards.layout`), after checking that the build
   still holds its lock (:func:`prl.store.holder.ensure_held`): in a local OUT the staged parts folder is renamed
   to ``OUT/<set-id>/``, then the staged meta folder (sample ids, ``manifest.json``) to ``.OUT.prl/sets/<set-id>/``
   (:mod:`prl.shards.publish`); to an ``s3://`` OUT the parts and sample ids are uploaded, then the manifest with
   a conditional put (:mod:`prl.shards.s3out`). A rebuild then retires the sets it replaces, and
   ``.OUT.prl/index.json`` is written: made before publishing (so that a manifest of OUT that cannot be read
   stops the build before it publishes anything), keeping the lines of the sets already in it
   (:mod:`prl.shards.index`). A build that ships nothing mends an index a killed build left one set behind.

A build with more traces rows to read than ``max_set_samples`` runs these steps once per turn
(:mod:`prl.shards.turns`): each turn publishes a set and advances the frontier with the files still pending, so
its memory is bounded by the cap, not by the store; its result lists every set (:attr:`ShardResult.sets`).

What a build reads of OUT does not grow with the sets there: their ids (a listing), the frontier, the sample ids
of sets the frontier does not account for (normally none), the index and one manifest; never every manifest.

Memory is bounded by one row group (:mod:`prl.shards.rowgroups`) per worker thread plus a few scalars per sample,
never by the table's token data; while the shards are written, the shipped rows' own values and scores wait on
disk (:mod:`prl.shards.shiprows`). The set id is derived from the source table versions, the options, the earlier
sets whose samples were skipped, the Parquet writer (:data:`prl.shards.writer.WRITER`) and the row-group size
(:data:`prl.shards.rowgroups.ROW_GROUP_TOKENS`); nothing in a set depends on the clock, so building the same
inputs again with the same pyarrow yields the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prl.engines import Engine, get_engine, split
from prl.errors import RetryableIOError, UsageError
from prl.kernel import Work, execute
from prl.progress import Task, task
from prl.runtime import release_free_memory
from prl.schema import SCHEMA_VERSION, SHARD
from prl.shards import rowgroups
from prl.shards.advance import advance_frontier
from prl.shards.frontier import Frontier, TraceSource, continued_source, trace_source
from prl.shards.gather import WORKERS
from prl.shards.manifest import MANIFEST, SAMPLES_FILE, FileEntry, Manifest, ManifestError, Totals
from prl.shards.merge_build import merged_statistics, planned_merged, unit_index, unit_scores
from prl.shards.options import ShardOptions
from prl.shards.parts import PartJob, PartWritten, Spills
from prl.shards.plan import Plan, make_plan
from prl.shards.publish import Staging, publish_file, write_json
from prl.shards.result import ShardResult
from prl.shards.rewards import resolve_rewards
from prl.shards.scores import LogRatioTotals, Scores, compute_scores, log_ratio_totals
from prl.shards.shiprows import ShipRows
from prl.shards.spill import ScanSpill
from prl.shards.statistics import build_statistics, heads_info, kl_cap_warning, kl_statistics, sampling_summary
from prl.shards.target import OutTarget, out_target
from prl.shards.writer import WRITER, write_sample_ids
from prl.store import holder
from prl.store.tables import Store

SIDE_SUMS = ("lp_sum", "lp_simple", "ref_sum", "ref_simple")
"""Plan columns the scores alone read (:func:`prl.shards.scores.log_ratio_totals`): dropped once they are made."""

LOG = logging.getLogger(__name__)


def build_shards(
    store: Store | str,
    out: str,
    *,
    options: ShardOptions | None = None,
    rebuild: bool = False,
    dry_run: bool = False,
    lock: bool = True,
    engine: Engine | str | None = None,
) -> ShardResult:
    """Build one shard set from ``store`` (a :class:`Store` or its URI) into ``out/<set-id>/`` (see the module
    docstring for the steps); ``out`` is a local folder or an ``s3://bucket/prefix``.

    Samples shipped by earlier sets in ``out`` are skipped unless ``rebuild``. ``dry_run`` plans and reports
    without writing anything. Unless ``dry_run`` (or ``lock=False``), the build holds the store's
    ``build-shards-<digest of OUT's id>`` lock (the id in ``.OUT.prl/out.json``, made by the first build; an
    ``s3://`` OUT's normalised URI), so two builds into one ``OUT``, however spelled or mounted, never overlap; a second one raises :class:`~prl.errors.LockedError`, and a
    build whose lock was taken over publishes nothing (:class:`~prl.errors.LockLostError`, exit 3). Raises
    :class:`~prl.errors.UsageError` for bad options, missing inputs, an ``OUT`` inside the store, an ``OUT`` that
    is neither empty nor a prl OUT of this layout, or an ``s3://`` OUT without credentials or bucket.

    ``engine`` (:func:`prl.engines.get_engine`: ``"local"``, the default, or ``"ray"``) decides where the parts are
    written; the plan, the scores and the publication run here, and the set is the same bytes on every engine.
    """
    store = store if isinstance(store, Store) else Store(store)
    engine = get_engine(engine)
    options = options or ShardOptions()
    target = out_target(out)
    target.check(store.uri)
    locked = lock and not dry_run
    step = ShardStep(target, options, rebuild, dry_run, target.lock_step() if locked else "build-shards")
    return execute(step, store, engine, lock=lock)


def _set_id(versions: dict[str, int | None], options: ShardOptions, prior: list[str]) -> str:
    """``v<traces version>-<digest>`` of what determines a set's bytes: schema, writer and row-group size,
    versions, options, and the earlier sets whose samples were skipped."""
    digest = hashlib.sha256(
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "writer": WRITER,
                "row_group_tokens": rowgroups.ROW_GROUP_TOKENS,
                "versions": versions,
                "options": options.to_dict(),
                "excluded_sets": sorted(prior),
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()
    return f"v{versions['traces']}-{digest[:12]}"


@dataclass
class ShardStep:
    """``prl build-shards`` as the kernel runs it (:mod:`prl.kernel`): one work per turn (:mod:`prl.shards.turns`)
    until nothing is pending, each the set's parts (``PartJob.write_published``) written into a staging folder,
    its commit the set's manifest and publication. ``lock``: the OUT's lock (``build-shards-<digest>``)."""

    target: OutTarget
    options: ShardOptions
    rebuild: bool
    dry_run: bool
    lock: str
    turns: list[ShardResult] = field(default_factory=list)
    ended: ShardResult | None = None
    """The result of a build that ends before its first turn: nothing to read, or a dry run."""
    versions: dict[str, int | None] = field(default_factory=dict)
    meter: Task | None = None
    after: tuple[Frontier, pa.Table] | None = None
    """The frontier the last turn left (with its backlog), None when it scanned nothing."""

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        """The build's turns: each plans the next set from the frontier the turn before left."""
        target, rebuild, dry_run = self.target, self.rebuild, self.dry_run
        versions = self.versions = store.versions()
        if self.options.kl != "none" and versions.get("ref_logprobs") is None:
            raise UsageError(
                f"KL is requested (kl = {self.options.kl!r}) but the store has no ref_logprobs table; ingest "
                "reference logprobs with `prl ingest --kind ref` or set kl = 'none'"
            )
        traces_version = versions.get("traces")
        if traces_version is None:
            if not dry_run:
                target.clean(keep=None)
            self.ended = ShardResult(out=target.uri, status="nothing_new", source_versions=versions)
            return
        options = self.options = resolve_rewards(store, versions.get("rewards"), self.options)
        prior = [] if rebuild else target.set_ids()
        source: TraceSource | None = trace_source(store, target.uri, traces_version, options, prior, rebuild)
        first_into_out = not prior and not rebuild  # OUT holds no set: nothing was dropped before
        with task("build-shards", unit="shards", turn=None) as meter:
            self.meter = meter
            while source is not None:
                meter.advance(turn=1)
                turn = ShardResult(out=target.uri, status="nothing_new", source_versions=versions)
                shipped = target.shipped_ids([set_id for set_id in prior if set_id not in source.covered_sets])
                set_id = _set_id(versions, options, prior)
                sources = _Sources(shipped, prior, source)
                if dry_run:
                    self.ended = _dry_run(store, versions, options, sources, set_id, turn)
                    return
                target.clean(keep=set_id)  # what killed builds left goes first, even when nothing is new
                replaces = [s for s in target.set_ids() if s != set_id] if rebuild else []
                self.after = None
                yield from self._turn(store, sources, set_id, turn, replaces, width)
                if turn.dropped_before is None and first_into_out:
                    turn.dropped_before = 0
                self.turns.append(turn)
                source, after = None, self.after
                if after is not None and after[0].pending:
                    source = continued_source(store, traces_version, after[0], after[1], options.max_set_samples)
                    if turn.status == "built":  # a rebuild goes on rebuilding until a turn has replaced the old sets
                        prior, rebuild = target.set_ids(), False

    def _turn(
        self,
        store: Store,
        sources: _Sources,
        set_id: str,
        result: ShardResult,
        replaces: list[str],
        width: Callable[..., int],
    ) -> Generator[Work, None, None]:
        """Plan one set with spills in a staging folder and hand its parts to the engine (the commit writes the
        manifest and publishes it), or, when nothing ships, remove the staging folder and advance the frontier;
        ``replaces``: the sets a rebuild replaces. The staging folder goes whatever stops the turn."""
        target, options, versions = self.target, self.options, self.versions
        staging = target.stage(set_id)
        try:
            spill_dir = staging.spill
            trace_spill = ScanSpill(os.path.join(spill_dir, "traces.arrow"))
            ref_spill = ScanSpill(os.path.join(spill_dir, "ref_logprobs.arrow")) if options.kl != "none" else None
            plan = make_plan(store, versions, options, sources.shipped, trace_spill, ref_spill, sources.source)
            result.count(plan, options)
            if plan.ship.is_empty():
                if result.all_dropped:
                    result.status = "all_dropped"
                target.discard(staging, nothing_shipped=True)
                self.after = advance_frontier(
                    target.uri, versions, options, plan, 0, sources.source, sources.prior, None
                )
                _mend_index(store, target)
                result.statistics = build_statistics(plan, None, options)
                return
            staged = _stage(staging, Spills(trace_spill, ref_spill, spill_dir), plan, options)
            assert self.meter is not None
            self.meter.grow(staged.job.parts)
            parts = staged.job.parts
            with ThreadPoolExecutor(max_workers=1) as io:
                sealed = io.submit(publish_file, f"{staged.samples_path}.tmp", staged.samples_path)  # beside the shards
                yield Work(
                    staged.job.write_published,
                    split(list(range(parts)), width(parts, threads=WORKERS)),
                    threads=WORKERS,
                    state=_Turn(staging, staged, sources, set_id, result, replaces, sealed),
                )
        except BaseException:
            target.discard(staging)
            raise

    def commit(self, store: Store, work: Work, outputs: Iterator[PartWritten]) -> None:
        """Fold the parts into the set's manifest, then publish the set: the index made first (an unreadable
        manifest of OUT stops the build here), the lock checked right before the commit, the sets a rebuild
        replaces retired, the index written and the frontier advanced."""
        assert self.meter is not None
        turn: _Turn = work.state
        target, result, set_id = self.target, turn.result, turn.set_id
        parts = []
        for written in outputs:
            parts.append(written)
            self.meter.advance(1)
        turn.sealed.result()
        manifest = _manifest(turn.staging, turn.staged, _Written.of(parts), self.options, self.versions, turn)
        index = target.next_index(manifest, turn.replaces)
        final = target.publish(turn.staging, set_id, _lock_check(store))
        target.retire(turn.replaces)
        target.write_index(index)
        self.after = advance_frontier(
            target.uri,
            self.versions,
            self.options,
            turn.staged.plan,
            turn.staged.shipped,
            turn.sources.source,
            turn.sources.prior,
            set_id,
        )
        result.status, result.set_id, result.set_dir = "built", set_id, final
        result.manifest_path = target.manifest_uri(set_id)
        result.rows, result.tokens = manifest.totals.rows, manifest.totals.tokens
        result.shipped_samples = turn.staged.shipped
        result.shards = [e.to_json() for e in manifest.shards]
        result.statistics = manifest.statistics
        warning = kl_cap_warning(manifest.statistics.get("kl"))
        if warning is not None:
            LOG.warning("set %s: %s", set_id, warning)

    def finish(self, seconds: float) -> ShardResult:
        return self.ended if self.ended is not None else ShardResult.of_turns(self.turns, self.options)


def _dry_run(
    store: Store,
    versions: dict[str, int | None],
    options: ShardOptions,
    sources: _Sources,
    set_id: str,
    result: ShardResult,
) -> ShardResult:
    """Plan the next set (the first turn's, when there are several) and report it, writing nothing."""
    plan = make_plan(store, versions, options, sources.shipped, source=sources.source)
    result.count(plan, options)
    result.pending_files = len(sources.source.pending)
    scores = None
    if not plan.ship.is_empty():
        result.status, result.set_id, result.rows = "dry_run", set_id, plan.ship.height
        result.tokens = int((plan.ship["prompt_len"] + plan.ship["completion_len"]).sum())
        if options.merge_turns:  # the rows and tokens the merged rows will have, as planned
            result.rows, result.tokens = planned_merged(plan.ship)
        scores = _scores(plan, options, None)
    result.statistics = build_statistics(plan, scores, options)
    return result


@dataclass
class _Sources:
    """What a build leaves out and reads: ``shipped`` (sample ids of earlier sets the frontier does not account
    for), ``prior`` (the ids of the current sets of OUT, none in a rebuild) and the traces ``source``."""

    shipped: pa.Array | None
    prior: list[str]
    source: TraceSource


def _mend_index(store: Store, target: OutTarget) -> None:
    """After a build that shipped nothing: mend an ``index.json`` that a build killed between publishing its set
    and writing the index left one set behind (:meth:`OutTarget.refresh_index`), once the build's lock is known
    to be still held (a lock taken over meanwhile is :class:`~prl.errors.LockLostError`, exit 3). The index is
    derived data: a manifest it would need that cannot be read, or a failed request, leaves it as it is (``prl
    verify`` reports it; the next build that publishes stops on such a manifest) rather than failing a build that
    had nothing to do."""
    _lock_check(store)()
    try:
        target.refresh_index()
    except (ManifestError, RetryableIOError):
        pass


def _lock_check(store: Store) -> Callable[[], None]:
    """What publication calls right before its commit: :class:`~prl.errors.LockLostError` (exit 3) when a lock
    this process holds on the store (the build's own) was taken over meanwhile."""
    return lambda: holder.ensure_held(store.location)


@dataclass
class _Staged:
    """A set planned and scored, its sample ids written, ready for its parts: ``job`` writes them."""

    plan: Plan
    job: PartJob
    statistics: dict[str, Any]
    shipped: int
    groups: int
    heads: dict[str, Any]
    sampling: dict[str, Any]
    samples_path: str
    samples_entry: FileEntry
    spill_folder: str


@dataclass
class _Turn:
    """What a turn's commit needs: the staging folder, the staged set, its sources, id and result (filled in),
    the sets it replaces, and the sample-id file being sealed (fsynced and renamed) beside the parts."""

    staging: Staging
    staged: _Staged
    sources: _Sources
    set_id: str
    result: ShardResult
    replaces: list[str]
    sealed: Future[None]


def _stage(staging: Staging, spills: Spills, plan: Plan, options: ShardOptions) -> _Staged:
    """Score the set and write its sample-id file into ``staging``; the parts' own values go to a file
    (:class:`prl.shards.shiprows.ShipRows`).

    Everything the manifest reads of the shipped rows is taken before the shards are written, and the shipped
    frame and the spills' row arrays are let go, so that beside the row groups in flight only the backlog of rows
    not shipped (sample id and file, for the next build's frontier) is held per sample."""
    ship = plan.ship
    shard_N = ship["shard"].to_numpy()
    bounds = np.searchsorted(shard_N, np.arange(int(shard_N[-1]) + 2))  # shards are runs of the final order
    totals = None
    if options.kl in ("reward", "advantages"):
        assert spills.ref is not None
        totals = log_ratio_totals(spills.traces, spills.ref, ship, bounds, options)
    scores = _scores(plan, options, totals)
    plan.ship = ship = ship.drop(SIDE_SUMS, strict=False)  # summed into the totals: not held any longer
    del totals
    release_free_memory()  # what the scores freed goes back before the sample ids are sorted
    statistics = build_statistics(plan, scores, options)
    shipped, groups = ship.height, int(ship["group_id"].n_unique())
    heads, sampling = heads_info(ship, plan.k), sampling_summary(ship)
    samples_path = os.path.join(staging.meta, SAMPLES_FILE)
    samples_entry = _write_samples(samples_path, ship["sample_id"].to_arrow())
    units_N = unit_index(ship) if options.merge_turns else None
    path = os.path.join(spills.folder, "ship.arrow")
    rows = ShipRows.write(path, ship, bounds, spills.traces, spills.ref, scores, units_N)
    plan.ship = ship = ship.clear()  # in the file now: not held beside the row groups in flight
    mean_d = scores.mean_d
    del units_N, shard_N, scores
    for spill in (spills.traces, spills.ref):
        if spill is not None:
            spill.forget_rows()
    release_free_memory()  # what the plan and the scores freed goes back now, not beside the row groups in flight
    job = PartJob(staging.parts, spills, rows, bounds, mean_d, options, plan.k)
    return _Staged(plan, job, statistics, shipped, groups, heads, sampling, samples_path, samples_entry, spills.folder)


def _manifest(
    staging: Staging,
    staged: _Staged,
    written: _Written,
    options: ShardOptions,
    versions: dict[str, int | None],
    turn: _Turn,
) -> Manifest:
    """Once every part is written: the set's manifest, written into ``staging`` (the spills are done with)."""
    shutil.rmtree(staged.spill_folder, ignore_errors=True)
    statistics, mean_d = staged.statistics, staged.job.mean_d
    if options.kl != "none":
        statistics["kl"] = kl_statistics(options, mean_d, written.kl_sum, written.kl_tokens, written.kl_capped)
    statistics["unsafe_masked"] = {"tokens": written.unsafe_tokens, "samples": written.unsafe_samples}
    if options.merge_turns:
        statistics["merged_turns"] = merged_statistics(staged.shipped, written.entries, written.unmerged_tokens)
    plan = staged.plan
    manifest = Manifest(
        set_id=turn.set_id,
        schema_version=SCHEMA_VERSION,
        columns=SHARD.names,
        options=options.to_dict(),
        options_sha256=options.digest(),
        source_versions=versions,
        current_version=plan.current_version,
        excluded_sets=sorted(turn.sources.prior),
        shuffle={"seed": options.seed, "unit": "group", "target_tokens": options.target_tokens},
        shards=written.entries,
        samples=staged.samples_entry,
        totals=Totals(
            rows=sum(e.rows for e in written.entries),
            groups=staged.groups,
            tokens=sum(e.tokens or 0 for e in written.entries),
            completion_tokens=sum(e.completion_tokens or 0 for e in written.entries),
            shards=len(written.entries),
        ),
        heads=staged.heads,
        statistics=statistics,
        drops=plan.drops,
        conventions=_conventions(options),
        sampling=staged.sampling,
        check_reasons=plan.check_reasons,
    )
    write_json(os.path.join(staging.meta, MANIFEST), manifest.to_json())
    return manifest


def _scores(plan: Plan, options: ShardOptions, totals: LogRatioTotals | None) -> Scores:
    """Per shipped sample, or with ``merge_turns`` per merged unit (:func:`prl.shards.merge_build.unit_scores`)."""
    if options.merge_turns:
        return unit_scores(plan.ship, options, totals)
    return compute_scores(plan.ship, options, totals)


def _conventions(options: ShardOptions) -> dict[str, object]:
    """How a trainer reads the columns (recorded in the manifest)."""
    token_advantages = "advantage on loss_mask tokens, 0 elsewhere"
    if options.kl == "advantages":
        token_advantages += ", plus kl_coef·(mean_log_ratio − d_t) on valid tokens"
    return {
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
        "token_advantages": token_advantages,
        "kl": "per-token estimate; null where the token is outside loss_mask or a logprob is missing",
        "behavior_logprobs": "as sampled; null where the server gave none (never 0.0)",
        "loss_mask": "completion mask, less every position whose behaviour or reference logprob is null or not "
        "finite (counted in statistics.unsafe_masked): no loss multiplies an undefined value",
    }


def _write_samples(path: str, sample_ids: pa.Array) -> FileEntry:
    """Write the set's sorted sample ids to ``<path>.tmp`` (not fsynced, not renamed:
    :func:`prl.shards.publish.publish_file` does both). The build writes them before its shards, so that the sort
    and the writer's dictionary (both as long as the samples) are freed before the shards' buffers are taken, not
    held beside them."""
    sample_ids = sample_ids.cast(pa.string())
    size, sha256 = write_sample_ids(sample_ids.take(pc.sort_indices(sample_ids)), f"{path}.tmp")
    return FileEntry(os.path.basename(path), len(sample_ids), size, sha256)


@dataclass
class _Written:
    """The shards written, in order, with the sum (float64) and count of their per-token KL values."""

    entries: list[FileEntry]
    kl_sum: float
    kl_tokens: int
    unsafe_tokens: int = 0
    unsafe_samples: int = 0
    unmerged_tokens: int = 0
    """With ``merge_turns``: Σ prompt + completion of the turns shipped (their tokens without merging)."""
    kl_capped: int = 0
    """With k3: the KL values at its cap."""

    @classmethod
    def of(cls, parts: list[PartWritten]) -> _Written:
        """The totals of ``parts`` (any order), entries in shard order."""
        parts = sorted(parts, key=lambda p: p.shard)
        out = cls([p.entry for p in parts], 0.0, 0)
        for p in parts:  # in shard order: the float sum does not depend on where the parts were written
            out.kl_sum += p.kl_sum
            out.kl_tokens += p.kl_tokens
            out.unsafe_tokens += p.unsafe_tokens
            out.unsafe_samples += p.unsafe_samples
            out.unmerged_tokens += p.unmerged_tokens
            out.kl_capped += p.kl_capped
        return out


__all__ = ["WORKERS", "ShardResult", "build_shards"]
