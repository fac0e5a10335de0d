"""``prl score-ref``: reference logprobs for every sample that has none for the ``ref_model`` yet.

The samples to score are the ``traces`` rows (at the table's current version) whose ``sample_id`` has no
``ref_logprobs`` row with this ``ref_model``: the anti-join is answered from the two tables' ``sample_id``
columns, so a rerun scores only what is missing. Samples stream in batches of about ``batch_tokens`` tokens
(prompt + completion), cut file by file (:mod:`prl.score.select`); each batch is scored, validated (:func:`prl.score.base.completion_logprobs`) and committed
to ``ref_logprobs`` in one atomic Delta commit, then its refusals to ``quarantine`` (reason codes of
:mod:`prl.score.base` and the backends; table ``ref_logprobs``, ``source_uri`` ``score-ref:<ref_model>``).
A run killed at any instant loses only its uncommitted batch; the next run scores the rest and duplicates
nothing. Quarantined samples have no row, so every run tries them again (a server that was briefly wrong may
answer well later); their quarantine rows are never repeated.

Only token IDs are sent, never text. The run holds the store's ``score-ref`` lock. A dry run selects and counts
the samples and tokens it would score, and neither loads the model nor calls the endpoint.

``engine="ray"`` scores the traces files on a Ray cluster (:mod:`prl.score.remote`): each worker opens the backend
once, scores the same batches as the local engine and writes each batch's rows as a data file; this process
commits every batch as it comes back, with the same metadata, then its refusals. A worker or driver killed
mid-run leaves only uncommitted files: the next run scores what is still missing.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from prl import bounds
from prl.bounds import MAX_BATCH_TOKENS, MAX_CONCURRENCY, MAX_RETRIES, check_int, check_seconds
from prl.engines import Engine
from prl.errors import ExitCode, UsageError
from prl.kernel import Work, execute
from prl.options import ScoreRefOptions
from prl.progress import Task, task
from prl.quarantine import new_quarantine_rows, quarantine_batches
from prl.score.backends import BackendSpec, backend_kind
from prl.score.base import ScoreRequest
from prl.score.http import public_url
from prl.score.remote import ScoreJob, release, score_file
from prl.score.scored import ScoredBatch
from prl.score.select import Pending, file_batches, pending
from prl.store.resolve import open_store
from prl.store.tables import Store

LOCK = "score-ref"
DEFAULT_BATCH_TOKENS = bounds.BATCH_TOKENS


@dataclass
class ScoreResult:
    """What one ``prl score-ref`` did. ``input_tokens`` counts prompt + completion tokens sent to the model,
    ``completion_tokens`` the logprobs written; ``tokens_per_second`` is ``input_tokens`` over the scoring time
    (model and endpoint time, reads and commits included; loading the model, ``load_seconds``, excluded)."""

    store: str
    ref_model: str
    backend: str
    source: str
    candidates: int = 0
    """Samples that had no reference logprobs for ``ref_model`` when the run began."""
    scored: int = 0
    input_tokens: int = 0
    completion_tokens: int = 0
    batches: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    load_seconds: float = 0.0
    tokens_per_second: float = 0.0
    version: int | None = None
    """The ``ref_logprobs`` table version after the run."""
    dry_run: bool = False
    max_quarantine_rate: float = bounds.MAX_QUARANTINE_RATE

    @property
    def exit_code(self) -> ExitCode:
        """1 when more than ``max_quarantine_rate`` of the samples looked at were quarantined, else 0."""
        refused = sum(self.quarantined.values())
        seen = self.scored + refused
        return ExitCode.DATA_PROBLEMS if seen and refused / seen > self.max_quarantine_rate else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "command": "score-ref", "exit_code": int(self.exit_code)}

    def headline(self) -> str:
        """``score-ref: 40 of 40 missing samples scored (ref, vllm), 0 quarantined, 12,000 tokens/s``."""
        return (
            f"score-ref{' (dry run)' if self.dry_run else ''}: {self.scored:,} of {self.candidates:,} missing "
            f"samples scored ({self.ref_model}, {self.backend}), {sum(self.quarantined.values()):,} quarantined, "
            f"{self.tokens_per_second:,.0f} tokens/s"
        )


def score_ref(
    store: Store | str,
    ref_model: str,
    *,
    endpoint: str | None = None,
    model: str | None = None,
    backend: str = ScoreRefOptions.backend,
    served_model: str | None = None,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    concurrency: int = bounds.CONCURRENCY,
    retries: int = bounds.RETRIES,
    timeout: float = bounds.TIMEOUT_S,
    max_quarantine_rate: float = bounds.MAX_QUARANTINE_RATE,
    dry_run: bool = False,
    engine: Engine | str | None = None,
) -> ScoreResult:
    """Score every sample of ``store`` lacking reference logprobs for ``ref_model`` with one backend: an
    ``endpoint`` URL (``backend`` ``vllm``, ``sglang``, ``tinker`` — a Tinker service's base URL, with
    ``served_model`` the base model or ``tinker://`` checkpoint — or ``auto``: a URL ending in ``/generate`` is
    SGLang, anything else vLLM) or a local ``model`` folder. Raises :class:`UsageError` for bad options,
    :class:`~prl.errors.RetryableIOError` when the endpoint stays down (batches committed before are kept).

    ``engine`` (:func:`prl.engines.get_engine`: ``"local"``, the default, or ``"ray"``) decides where the batches
    are scored (on Ray, each worker opens the backend itself); the lock, the selection and the commits stay in
    this process, with the same batches, rows and commit metadata on every engine. A dry run never leaves it."""
    if not ref_model:
        raise UsageError("--ref-model must name the reference model")
    if (endpoint is None) == (model is None):
        raise UsageError("give exactly one of --endpoint URL and --model PATH")
    check_int("--batch-tokens", batch_tokens, 1, MAX_BATCH_TOKENS)
    check_int("--concurrency", concurrency, 1, MAX_CONCURRENCY)
    check_int("--retries", retries, 0, MAX_RETRIES)
    timeout = check_seconds("--timeout", timeout)
    store = open_store(store, writing=not dry_run)
    kind = backend_kind(endpoint, backend)
    if kind == "tinker" and not served_model:
        raise UsageError("--backend tinker needs --served-model: a base model name or a tinker:// checkpoint path")
    spec = BackendSpec(kind, endpoint, model, served_model, batch_tokens, concurrency, retries, timeout)
    source = public_url(endpoint) if endpoint is not None else os.path.abspath(str(model))
    result = ScoreResult(store.uri, ref_model, kind, source, dry_run=dry_run)
    result.max_quarantine_rate = max_quarantine_rate
    started = time.perf_counter()
    return execute(ScoreStep(result, spec, dry_run), store, engine, started=started)


@dataclass
class ScoreStep:
    """``prl score-ref`` as the kernel runs it (:mod:`prl.kernel`): one work, a task per traces file holding
    samples to score (``score_file``), each scored batch committed as it comes back. ``backend``: what scores
    them."""

    result: ScoreResult
    backend: BackendSpec
    dry_run: bool
    lock: str = LOCK
    meter: Task | None = None

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        """The samples lacking reference logprobs; a dry run counts them and scores nothing."""
        result = self.result
        with task("score-ref", unit="samples") as meter:
            self.meter = meter
            todo = pending(store, result.ref_model)
            if todo is not None and self.dry_run:
                for batch in _batches(store, todo, self.backend.batch_tokens):
                    result.candidates += len(batch)
                    result.input_tokens += sum(r.tokens for r in batch)
                    result.completion_tokens += sum(len(r.completion_ids) for r in batch)
            elif todo is not None:
                missing = todo.count(store)
                meter.grow(missing)
                if missing:  # none missing: no task starts, no model loads
                    job = ScoreJob(store.uri, result.ref_model, self.backend, todo.paths, todo.where)
                    try:
                        tasks = list(range(len(job.paths)))
                        yield Work(functools.partial(score_file, job), tasks, gpu=job.backend.kind == "local")
                    finally:
                        release(job)
            result.version = store.version("ref_logprobs")

    def commit(self, store: Store, work: Work, outputs: Iterator[ScoredBatch]) -> None:
        """Commit each scored batch as it comes back (on the local engine, before the next batch is scored); a
        batch that comes back twice (a task run again) is committed once."""
        assert self.meter is not None
        done: set[tuple[int, int]] = set()
        for scored in outputs:
            if (scored.file, scored.number) in done:
                continue
            done.add((scored.file, scored.number))
            self.result.load_seconds = max(self.result.load_seconds, scored.load_seconds)
            self.result.source = scored.source
            _commit(store, self.result.ref_model, scored, self.result, self.meter)

    def finish(self, seconds: float) -> ScoreResult:
        result = self.result
        result.seconds = seconds
        scoring = result.seconds - result.load_seconds
        result.tokens_per_second = result.input_tokens / scoring if scoring > 0 and not self.dry_run else 0.0
        return result


def _batches(store: Store, todo: Pending, batch_tokens: int) -> Iterator[list[ScoreRequest]]:
    """Every batch of the run, file after file (see :mod:`prl.score.select`)."""
    for path in todo.paths:
        yield from file_batches(store, path, todo.where, batch_tokens)


def _commit(store: Store, ref_model: str, scored: ScoredBatch, result: ScoreResult, meter: Task) -> None:
    """Commit one scored batch (its rows, then its quarantine records) and count it (``meter``: its samples)."""
    if scored.adds:
        metadata = {"command": "score-ref", "ref_model": ref_model, "backend": scored.backend, "source": scored.source}
        scored.pending(store).commit(metadata=metadata)
    if scored.quarantine_rows:
        store.commit("quarantine", quarantine_batches(new_quarantine_rows(store, scored.quarantine_rows)))
    result.batches += 1
    result.candidates += scored.requests
    result.scored += scored.rows
    result.input_tokens += scored.input_tokens
    result.completion_tokens += scored.completion_tokens
    for reason, count in scored.refused.items():
        result.quarantined[reason] = result.quarantined.get(reason, 0) + count
    meter.advance(scored.requests)


__all__ = ["ScoreResult", "score_ref"]
