"""score-ref's task: the batches of one traces file, scored wherever the engine runs it (:mod:`prl.engines`).

The driver describes the run in a :class:`ScoreJob` (the store, the reference model's name, how to open the
backend, the traces files and the anti-join filter). The engine runs :func:`score_file` on each file's number: the
file's pending rows are cut into batches (:func:`prl.score.select.file_batches`), scored by the backend the process
opened once for the run, and written as ``ref_logprobs`` data files; one :class:`~prl.score.scored.ScoredBatch` per
batch comes back, and the driver commits it. Nothing here commits.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow.dataset as ds

from prl.score.backends import BackendSpec
from prl.score.base import Backend
from prl.score.scored import ScoredBatch, score_batch
from prl.score.select import file_batches
from prl.store.tables import Store


@dataclass(frozen=True)
class ScoreJob:
    """One score-ref run as its workers need it. ``paths``: traces data files (relative to the table folder);
    ``where``: the filter that leaves out samples already scored (None: none are)."""

    store_uri: str
    ref_model: str
    backend: BackendSpec
    paths: list[str]
    where: ds.Expression | None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)


_OPENED = threading.local()
"""Per thread, the backend of the run it last served (``run``: run id → backend, seconds it took to open): a worker
serves many files of one run and loads the model once; the local engine runs the tasks in the caller's thread, so
two runs in two threads of one process keep a backend each."""


def _opened() -> dict[str, tuple[Backend, float]]:
    kept: dict[str, tuple[Backend, float]] | None = getattr(_OPENED, "run", None)
    if kept is None:
        kept = _OPENED.run = {}
    return kept


def _backend(job: ScoreJob) -> tuple[Backend, float]:
    kept = _opened()
    opened = kept.get(job.run_id)
    if opened is None:
        for old, _ in kept.values():  # an earlier run this worker served
            old.close()
        kept.clear()
        started = time.perf_counter()
        backend = job.backend.open()
        opened = kept[job.run_id] = (backend, time.perf_counter() - started)
    return opened


def score_file(job: ScoreJob, file: int) -> Iterator[ScoredBatch]:
    """Score the pending rows of the traces file numbered ``file``; one :class:`ScoredBatch` per batch, each as soon
    as it is written (the local engine hands it to the driver to commit before the next batch is scored). The
    backend is opened at the first batch (a file with nothing pending loads no model)."""
    store = Store(job.store_uri)
    for number, batch in enumerate(file_batches(store, job.paths[file], job.where, job.backend.batch_tokens)):
        fresh = job.run_id not in _opened()
        scorer, load_seconds = _backend(job)
        scored = score_batch(store, scorer, job.ref_model, batch, file, number)
        scored.load_seconds = load_seconds if fresh else 0.0
        yield scored


def release(job: ScoreJob) -> None:
    """Close the backend this process opened for ``job``'s run, if any (the driver, once the run ends: on the local
    engine the run's tasks opened it here)."""
    opened = _opened().pop(job.run_id, None)
    if opened is not None:
        opened[0].close()


__all__ = ["ScoreJob", "release", "score_file"]
