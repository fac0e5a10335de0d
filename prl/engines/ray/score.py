"""score-ref on Ray: the traces files of a run are scored by Ray Data tasks, one file per task.

The driver selects (:mod:`prl.score.select`) and commits (:mod:`prl.score.run`); here the file indices become a
Ray Data dataset of one block per file, and ``map_batches`` runs :func:`prl.score.remote.score_block` on each: the
same batches as the local engine, scored by a backend each worker process opens once per run, each batch's rows
written as a ``ref_logprobs`` data file. A task of the local backend takes one GPU where the cluster has GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prl.engines.ray import reporting
from prl.score.remote import ScoreJob, score_block
from prl.score.scored import ScoredBatch

if TYPE_CHECKING:
    from prl.engines.ray import RayEngine


def score_files(engine: RayEngine, job: ScoreJob) -> Iterator[ScoredBatch]:
    """Every pending sample of ``job`` scored on the cluster; the batches in the order their files finish."""
    if not job.paths:
        return
    ray = engine.connect()
    files = ray.data.from_items([{"file": i} for i in range(len(job.paths))], override_num_blocks=len(job.paths))
    resources = engine.remote_args()
    if job.backend.kind == "local" and ray.cluster_resources().get("GPU", 0) >= 1:
        resources["num_gpus"] = 1
    scored = files.map_batches(
        reporting(score_block), fn_kwargs={"job": job}, batch_format="pyarrow", batch_size=1, **resources
    )
    for row in engine.rows(scored):
        yield ScoredBatch.from_row(row)


__all__ = ["score_files"]
