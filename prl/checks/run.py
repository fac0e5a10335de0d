"""``check_tokens``: stream the traces table, run every check on each batch, append verdict rows to
``STORE/checks`` and return a :class:`~prl.checks.result.CheckResult`.

Incremental: samples already checked under the same tokenizer fingerprint (tokenizer.json bytes, chat
template, options) are left out of the scan (an anti-join on ``sample_id``); a run killed at any point
loses at most its uncommitted chunk, and the next run picks up there. Memory is bounded by one batch, the
segment and template caches, the multi-turn sequence cache (a token budget) and the key columns of
multi-turn rows.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from prl.bounds import MAX_TEMPLATE_TIMEOUTS_LIMIT, TEMPLATE_TIMEOUTS, check_int
from prl.checks.arrays import Ragged
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.heads import check_heads
from prl.checks.history import INDEX_SCHEMA, SequenceCache, previous_for, trajectory_index
from prl.checks.logprobs import check_logprobs
from prl.checks.options import CheckOptions
from prl.checks.prefix import check_prefix
from prl.checks.progress import progress
from prl.checks.remote import CheckedBatch, CheckJob, check_pieces, lending, pieces
from prl.checks.result import GROUP_COLUMNS, CheckResult, Example
from prl.checks.roundtrip import PendingSegments, RoundTripper, roundtrip_findings
from prl.checks.special import check_special
from prl.checks.template import TemplateChecker
from prl.checks.tokenizer import CheckTokenizer
from prl.checks.verdict import RowVerdict, assemble
from prl.checks.vocab import check_vocab, max_id
from prl.engines import Engine, split
from prl.errors import UsageError
from prl.kernel import Work, execute
from prl.options import CheckTokensOptions, checked
from prl.progress import Task, task
from prl.store.changes import files_dataset, snapshot_files, snapshot_turn_files
from prl.store.resolve import open_store
from prl.store.tables import Store
from prl.verdicts import REASONS, SEVERITY

NO_SESSIONS = pl.DataFrame(schema=INDEX_SCHEMA)
"""The session index of new rows that belong to no session: the multi-turn history need not be read."""
MISMATCH_FRACTION = 0.5
"""More than this fraction of a run's first batch with out-of-vocabulary IDs means the wrong tokenizer."""


def keep_sampled(sample_ids: list[str], rate: float) -> np.ndarray:
    """Deterministic sampling by sample_id: the same samples are picked on every run (bool[R])."""
    if rate >= 1.0:
        return np.ones(len(sample_ids), dtype=bool)
    bound = int(rate * (1 << 64))
    return np.array(
        [int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big") < bound for s in sample_ids],
        dtype=bool,
    )


def guard_vocab(tb: TokenBatch, vocab_ok: np.ndarray, tok: CheckTokenizer) -> None:
    """A :class:`UsageError` when most of a run's first batch holds out-of-vocabulary IDs (the wrong tokenizer)."""
    bad = int((~vocab_ok).sum())
    if bad >= 2 and bad > MISMATCH_FRACTION * tb.rows:
        raise UsageError(
            f"tokenizer {tok.path} does not match the data: {bad} of {tb.rows} samples hold "
            f"token IDs outside its vocabulary of {tok.vocab_size} (largest ID {max_id(tb)})"
        )


@dataclass
class _Started:
    """A batch between :meth:`BatchChecker.start` and :meth:`BatchChecker.finish`: its round trip running, the
    findings of the checks before it and after it (kept apart so that a row's findings stay in check order)."""

    tb: TokenBatch
    seq: Ragged
    before: Findings
    roundtrip: PendingSegments
    after: Findings
    status: list[str | None]
    heads_present: np.ndarray


@dataclass
class BatchChecker:
    """Runs every check on batches of one run, sharing the caches between batches. With ``overlap`` the round
    trip's tokenizer calls run on a thread of their own (:class:`RoundTripper`), so that a caller may
    :meth:`start` the next batch before it :meth:`finish`-es this one; :meth:`close` ends the helpers."""

    store: Store
    tok: CheckTokenizer
    opts: CheckOptions
    fingerprint: str
    traces_version: int
    index: pl.DataFrame
    overlap: bool = False
    template_timeouts: int = TEMPLATE_TIMEOUTS
    """Render time-outs allowed before the rest of the run's conversations get ``template_budget`` unrendered."""
    roundtrip: RoundTripper = field(init=False)
    template: TemplateChecker = field(init=False)
    sequences: SequenceCache = field(default_factory=SequenceCache)
    undetermined: dict[str, int] = field(default_factory=dict)
    """Why → samples whose previous turn could not be determined (reason ``prefix_unordered``)."""

    def __post_init__(self) -> None:
        self.roundtrip = RoundTripper(self.tok, background=self.overlap)
        self.template = TemplateChecker(self.tok, max_timeouts=self.template_timeouts)

    def start(self, rb: pa.RecordBatch, guard: bool = False) -> _Started:
        """Run every check of one batch of traces rows but the end of its round trip (the tokenizer calls may go
        on meanwhile). ``guard``: raise :class:`UsageError` first when the tokenizer does not match the data."""
        tb = TokenBatch.from_record_batch(rb)
        vocab_size = self.tok.vocab_size
        before, vocab_ok = check_vocab(tb, vocab_size)
        if guard:
            guard_vocab(tb, vocab_ok, self.tok)
        before.extend(check_logprobs(tb, self.opts))
        seq = tb.sequence()
        pending = self.roundtrip.submit(seq, vocab_ok)
        after = self.template.check(tb, vocab_ok)
        status = self._prefix(tb, after)
        after.extend(check_special(tb, self.tok, vocab_ok))
        heads, heads_present = check_heads(tb, vocab_size, self.opts)
        after.extend(heads)
        return _Started(tb, seq, before, pending, after, status, heads_present)

    def finish(self, started: _Started) -> tuple[pa.RecordBatch, list[RowVerdict], list]:
        """Verdict rows, non-ok rows, and prefix status per row of a started batch."""
        tb, findings = started.tb, started.before
        failures = self.roundtrip.finish(started.roundtrip)
        findings.extend(roundtrip_findings(tb, started.seq, failures, self.roundtrip))
        findings.extend(started.after)
        out, flagged = assemble(tb, findings, started.status, started.heads_present, self.fingerprint, self.tok)
        return out, flagged, started.status

    def close(self) -> None:
        """End the render worker and the tokenizer thread (later batches start new ones)."""
        self.template.close()
        self.roundtrip.close()

    def _prefix(self, tb: TokenBatch, findings: Findings) -> list[str | None]:
        previous, undetermined = previous_for(self.index, tb.sample_id)
        wanted = {sid for cands in previous if cands for sid in cands}
        if not wanted and not any(undetermined):
            return [None] * tb.rows
        sequences = self.sequences.get_many(self.store, self.traces_version, wanted) if wanted else {}
        found, status = check_prefix(tb, previous, sequences, self.opts.realign_window, undetermined)
        for (_, code), evidence in found.evidence.items():
            if code == "prefix_unordered":
                self.undetermined[evidence["why"]] = self.undetermined.get(evidence["why"], 0) + 1
        findings.extend(found)
        return status

    def remember(self, rb: pa.RecordBatch) -> None:
        """Cache the sequences of a batch's multi-turn rows: later turns compare against them."""
        has_session = rb.column("session_id").is_valid().to_numpy(zero_copy_only=False)
        if has_session.any():
            self.sequences.put_batch(rb, only=has_session)


def check_tokens(
    store: Store | str,
    tokenizer: str,
    *,
    chat_template: str | None = None,
    max_drift_rate: float | None = None,
    sample_rate: float = CheckTokensOptions.sample_rate,
    allow_warn: bool = CheckTokensOptions.allow_warn,
    dry_run: bool = False,
    lock: bool = True,
    options: CheckOptions | None = None,
    batch_size: int = 2048,
    commit_rows: int = 1 << 18,
    worst: int = 10,
    on_batch: Callable[[int], None] | None = None,
    engine: Engine | str | None = None,
    max_template_timeouts: int = TEMPLATE_TIMEOUTS,
) -> CheckResult:
    """Check every not-yet-checked sample of ``store``'s traces (a :class:`Store` or its URI) against ``tokenizer``.

    ``tokenizer``: a tokenizer.json or a folder holding one; ``chat_template``: a Jinja file (or source)
    for the ``template`` check, default the folder's tokenizer_config.json template; ``max_drift_rate``: the
    problem rate above which ``exit_code`` is 1; ``sample_rate``: fraction of samples checked, picked by
    sample_id hash; ``allow_warn``: when False, warn verdicts count as problems; ``dry_run``: check and
    report, write nothing; ``max_template_timeouts``: conversations whose rendering may break the time budget
    before the rest of the run's get ``template_budget`` without a render (:mod:`prl.checks.template_worker`). Verdict rows are committed every ``commit_rows`` rows. Raises
    :class:`UsageError` for a missing tokenizer or template, bad options, or a tokenizer that does not match
    the data.

    ``engine`` (:func:`prl.engines.get_engine`: ``"local"``, the default, or ``"ray"``) decides where the batches
    are checked; the lock, the run summary and the commits stay in this process, with the same rows and commit
    metadata on every engine.
    """
    checked(CheckTokensOptions, "sample_rate", sample_rate)
    checked(CheckTokensOptions, "max_drift_rate", max_drift_rate)
    check_int("--max-template-timeouts", max_template_timeouts, 1, MAX_TEMPLATE_TIMEOUTS_LIMIT)
    store = open_store(store, writing=not dry_run)
    started = time.perf_counter()
    opts = options or CheckOptions()
    tok = CheckTokenizer.load(tokenizer, chat_template, opts.stop_token_ids)
    fingerprint = tok.fingerprint(opts.to_dict())
    traces_version = store.version("traces")
    result = CheckResult(
        store=store.uri,
        tokenizer=tok.path,
        fingerprint=fingerprint,
        template=tok.template is not None,
        traces_version=traces_version,
        dry_run=dry_run,
        max_drift_rate=max_drift_rate,
        allow_warn=allow_warn,
        sample_rate=sample_rate,
    )
    if traces_version is None:
        result.elapsed_s = time.perf_counter() - started
        return result
    step = CheckStep(
        result,
        tok,
        opts,
        dry_run,
        batch_size,
        commit_rows,
        worst,
        on_batch,
        tokenizer,
        chat_template,
        max_template_timeouts,
    )
    return execute(step, store, engine, lock=lock, started=started)


@dataclass
class _Counts:
    """Run totals that come from the checker rather than from the verdict rows."""

    tokens: int = 0
    tokens_encoded: int = 0
    undetermined: dict[str, int] = field(default_factory=dict)

    def add(self, batch: CheckedBatch) -> None:
        self.tokens += batch.tokens
        self.tokens_encoded += batch.tokens_encoded
        for why, n in batch.undetermined.items():
            self.undetermined[why] = self.undetermined.get(why, 0) + n


@dataclass
class CheckStep:
    """``prl check-tokens`` as the kernel runs it (:mod:`prl.kernel`): one work, the traces rows not yet checked
    under this fingerprint cut into pieces (``check_pieces``), its verdicts committed a chunk of ``commit_rows``
    at a time, the last commit with the watermark. ``tokenizer``, ``chat_template`` and ``template_timeouts``
    are the arguments a task loads its checker from."""

    result: CheckResult
    tok: CheckTokenizer
    opts: CheckOptions
    dry_run: bool
    batch_size: int
    commit_rows: int
    worst: int
    on_batch: Callable[[int], None] | None
    tokenizer: str
    chat_template: str | None
    template_timeouts: int
    lock: str = "check-tokens"
    counts: _Counts = field(default_factory=_Counts)
    meter: Task | None = None

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        """The pieces to check (whole files when the engine wants no more tasks than files, else row groups),
        with the tokenizer lent to tasks run in this process."""
        result = self.result
        fingerprint, traces_version, sample_rate = result.fingerprint, result.traces_version, result.sample_rate
        assert traces_version is not None
        with lending(fingerprint, self.tok), task("check-tokens", unit="samples") as meter:
            self.meter = meter
            plan = progress(store, fingerprint, sample_rate, traces_version)
            result.skipped_existing = plan.previously
            if plan.up_to_date:
                return
            flt = None if plan.done is None else ~pc.field("sample_id").isin(plan.done)
            if plan.paths is None:
                sessions = trajectory_index(store, traces_version)
            else:
                new = files_dataset(store, "traces", plan.paths)
                multi_turn = new.count_rows(filter=pc.field("session_id").is_valid()) > 0
                sessions = trajectory_index(store, traces_version) if multi_turn else NO_SESSIONS
            meter.grow(_rows_to_check(store, traces_version, plan.paths, plan.done))
            files = plan.paths if plan.paths is not None else snapshot_files(store, "traces", traces_version)
            root = store.table_path("traces")
            job = CheckJob(
                store.uri,
                self.tokenizer,
                self.chat_template,
                self.opts,
                fingerprint,
                traces_version,
                sample_rate,
                [f"{root}/{p}" for p in files],
                flt,
                sessions,
                self.batch_size,
                self.template_timeouts,
                {f"{root}/{p}": size for p, size in store.known_sizes("traces").items()},
            )
            cut: list[Any] = []
            if job.files:
                cut = pieces(job, width(len(job.files) + 1) <= len(job.files))  # no more tasks than files: whole
            yield Work(functools.partial(check_pieces, job), split(cut, width(len(cut))) if cut else [], state=plan)
        result.tokens = self.counts.tokens
        result.prefix_undetermined = dict(sorted(self.counts.undetermined.items()))
        result.tokens_roundtripped = self.counts.tokens_encoded

    def commit(self, store: Store, work: Work, outputs: Iterator[CheckedBatch]) -> None:
        """Fold the checked batches into the summary and commit their verdict rows, a chunk at a time; the
        tokenizer/data mismatch guard (in the first batch) runs before anything is written."""
        result, plan, meter = self.result, work.state, self.meter
        assert meter is not None
        heap: list[tuple[int, int, str, int, Example]] = []

        def verdict_batches() -> Iterator[pa.RecordBatch]:
            for batch in outputs:
                self.counts.add(batch)
                out = batch.verdicts
                result.sampled_out += batch.sampled_out
                meter.advance(batch.sampled_out + (0 if out is None else out.num_rows))
                if out is None or out.num_rows == 0:
                    continue
                _tally(result, out, batch.flagged, batch.status, heap, self.worst)
                if self.on_batch is not None:
                    self.on_batch(out.num_rows)
                yield out

        tok = self.tok
        metadata: dict[str, Any] = {
            "operation": "check-tokens",
            "tokenizer_fingerprint": result.fingerprint,
            "tokenizer": tok.path,
            "tokenizer_sha256": tok.tokenizer_bytes_sha256,
            "chat_template_sha256": hashlib.sha256((tok.template or "").encode()).hexdigest() if tok.template else None,
            "options": self.opts.to_dict(),
            "traces_version": result.traces_version,
            "sample_rate": result.sample_rate,
        }
        stream = verdict_batches()
        head = next(stream, None)  # the tokenizer/data mismatch guard runs before anything is written
        exhausted = head is None
        stream = itertools.chain([head] if head is not None else [], stream)

        def chunk() -> Iterator[pa.RecordBatch]:
            nonlocal exhausted
            rows = 0
            for b in stream:
                yield b
                rows += b.num_rows
                if rows >= self.commit_rows:
                    return
            exhausted = True

        while not exhausted:
            pending = store.write_files("checks", chunk(), dry_run=self.dry_run)
            watermark = None  # the last commit says that everything up to traces_version is checked
            if exhausted:
                metadata["checked_total"] = plan.previously + result.checked
                watermark = {plan.app_id: result.traces_version}
            committed = pending.commit(metadata=metadata, transactions=watermark)
            if committed.version is not None:
                result.checks_version = committed.version
        result.worst = [ex for *_, ex in sorted(heap, reverse=True)]

    def finish(self, seconds: float) -> CheckResult:
        self.result.elapsed_s = seconds
        return self.result


def _rows_to_check(store: Store, traces_version: int, paths: list[str] | None, done: pa.Array | None) -> int:
    """About how many rows a run scans: the rows of the traces files it reads (``paths``, None: the snapshot),
    from the log's statistics (no file is opened), less those already checked (``done``)."""
    files, rows = snapshot_turn_files(store, traces_version)
    total = sum(rows.get(p, 0) for p in (files if paths is None else paths))
    return max(0, total - (0 if done is None else len(done)))


def _tally(
    result: CheckResult,
    out: pa.RecordBatch,
    flagged: list[RowVerdict],
    status: list,
    heap: list[tuple[int, int, str, int, Example]],
    worst: int,
) -> None:
    """Fold one batch of verdicts into the run summary."""
    result.checked += out.num_rows
    # one Arrow group-by per batch (a few distinct rows), folded here; polars' group-bys, four a batch, waited on
    # its thread pool behind the tokenizer's threads for about a quarter of a short-record run
    combos = (
        pa.table(out.select(["verdict", *GROUP_COLUMNS]))
        .group_by(["verdict", *GROUP_COLUMNS], use_threads=False)
        .aggregate([([], "count_all")])
    )
    rows = list(zip(*(combos.column(c).to_pylist() for c in ("verdict", *GROUP_COLUMNS, "count_all")), strict=True))
    for verdict, *_, count in rows:
        result.verdicts[verdict] += count
    for s, count in Counter(s for s in status if s is not None).items():
        result.prefix[s] += count
    for i, name in enumerate(GROUP_COLUMNS, start=1):
        by: Counter[tuple[str | None, str]] = Counter()
        for row in rows:
            by[row[i], row[0]] += row[-1]
        slot = result.groups[name]
        for (value, verdict), count in sorted(by.items(), key=lambda kv: (kv[0][0] is not None, kv[0])):
            counts = slot.setdefault(str(value) if value is not None else "(none)", {"checked": 0})
            counts["checked"] += count
            counts[verdict] = counts.get(verdict, 0) + count
    if not flagged:
        return
    codes = Counter(itertools.chain.from_iterable(fv.reasons for fv in flagged))
    for code, count in codes.items():
        result.reasons[code] = result.reasons.get(code, 0) + count
    for fam, count in Counter(itertools.chain.from_iterable(_families(tuple(fv.reasons)) for fv in flagged)).items():
        result.checks[fam] += count
    if worst <= 0:
        return
    sample_ids: list[str] | None = None
    for fv in flagged:
        rank = (SEVERITY[fv.verdict], len(fv.reasons))
        if len(heap) >= worst and rank < heap[0][:2]:
            continue  # cannot displace the least bad of the worst kept so far
        if sample_ids is None:
            sample_ids = out.column("sample_id").to_pylist()
        key = (*rank, _neg_key(sample_ids[fv.row]), -result.checked - fv.row)
        if len(heap) >= worst and key <= heap[0][:4]:
            continue
        ex = Example(
            sample_id=sample_ids[fv.row],
            verdict=fv.verdict,
            reasons=fv.reasons,
            first_divergence=fv.position,
            detail=fv.detail,
            **{name: out.column(name)[fv.row].as_py() for name in GROUP_COLUMNS},
        )
        if len(heap) < worst:
            heapq.heappush(heap, (*key, ex))
        else:
            heapq.heapreplace(heap, (*key, ex))


@functools.lru_cache(maxsize=4096)
def _families(codes: tuple[str, ...]) -> tuple[str, ...]:
    """The check families of a row's reason codes, each once."""
    return tuple(dict.fromkeys(REASONS[code][0] for code in codes))


class _Negated(dict[int, str]):
    """Code point → its mirror ``chr(0x10FFFF - c)``, filled as code points are met (a ``str.translate`` table)."""

    def __missing__(self, c: int) -> str:
        self[c] = mirror = chr(0x10FFFF - c)
        return mirror


_NEGATED = _Negated()


def _neg_key(sample_id: str) -> str:
    """Ties between equally bad samples go to the smaller sample_id (stable output)."""
    return sample_id[:64].translate(_NEGATED)
