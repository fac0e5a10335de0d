"""score-ref batches scored away from the driver (another engine's workers, :mod:`prl.engines`).

The driver describes the run in a :class:`ScoreJob` (the store, the reference model's name, how to open the
backend, the traces files and the anti-join filter). A worker runs :func:`score_file` on each file's number: the
file's pending rows are cut into the same batches as on the local engine (:func:`prl.score.select.file_batches`),
scored by the backend this worker process opened once for the run, and written as ``ref_logprobs`` data files;
one :class:`~prl.score.scored.ScoredBatch` per batch comes back. The driver commits them as the local engine
commits its batches; nothing here commits.
"""

from __future__ import annotations

import time
import uuid
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


_BACKEND: dict[str, tuple[Backend, float]] = {}
"""The backend of the run this worker process last served (run id → backend, seconds it took to open): a worker
process serves many files of one run, and loads the model once."""


def _backend(job: ScoreJob) -> tuple[Backend, float]:
    opened = _BACKEND.get(job.run_id)
    if opened is None:
        for old, _ in _BACKEND.values():
            old.close()
        _BACKEND.clear()
        started = time.perf_counter()
        backend = job.backend.open()
        opened = _BACKEND[job.run_id] = (backend, time.perf_counter() - started)
    return opened


def score_file(job: ScoreJob, file: int) -> list[ScoredBatch]:
    """Score the pending rows of the traces file numbered ``file``; one :class:`ScoredBatch` per batch. The
    backend is opened at the first batch (a file with nothing pending loads no model)."""
    store = Store(job.store_uri)
    out = []
    for number, batch in enumerate(file_batches(store, job.paths[file], job.where, job.backend.batch_tokens)):
        fresh = job.run_id not in _BACKEND
        scorer, load_seconds = _backend(job)
        scored = score_batch(store, scorer, job.ref_model, batch, file, number)
        scored.load_seconds = load_seconds if fresh else 0.0
        out.append(scored)
    return out


__all__ = ["ScoreJob", "score_file"]
