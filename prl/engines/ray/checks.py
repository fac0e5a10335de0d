"""check-tokens on Ray: the pending traces rows are read and checked by Ray Data tasks.

``read_parquet`` over the run's traces files (with the driver's anti-join filter, so samples already checked are
never read), cut into :meth:`RayEngine.blocks` blocks, then ``map_batches`` of
:func:`prl.checks.remote.check_block` on each block: the same per-batch checker as the local engine, one worker
process loading the tokenizer once per run. The verdict batches stream back to the driver as they are done; the
driver tallies and commits them (:mod:`prl.checks.run`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prl.checks.batch import COLUMNS
from prl.checks.remote import CheckedBatch, CheckJob, check_block
from prl.engines.ray import reporting
from prl.store.tables import Store

if TYPE_CHECKING:
    from prl.engines.ray import RayEngine


def check_batches(engine: RayEngine, job: CheckJob) -> Iterator[CheckedBatch]:
    """Every pending row of ``job`` checked on the cluster, batch by batch, in the order they finish."""
    if not job.files:
        return
    ray = engine.connect()
    fs = Store(job.store_uri).fs
    kwargs = {} if job.pending is None else {"filter": job.pending}
    rows = ray.data.read_parquet(
        job.files,
        filesystem=fs,
        override_num_blocks=engine.blocks(len(job.files) * 8),
        partitioning=None,
        **_read_task_args(ray, engine.remote_args()),
        **kwargs,
    ).select_columns(list(COLUMNS))
    checked = rows.map_batches(
        reporting(check_block), fn_kwargs={"job": job}, batch_format="pyarrow", batch_size=None, **engine.remote_args()
    )
    for row in engine.rows(checked):
        yield CheckedBatch.from_row(row)


def _read_task_args(ray: Any, remote_args: dict[str, Any]) -> dict[str, Any]:
    """``remote_args`` (:meth:`RayEngine.remote_args`) as ``read_parquet`` takes them: as its own named parameters
    where this Ray has them all (``runtime_env`` and the like; ``ray_remote_args`` is deprecated from Ray 2.60),
    else as ``ray_remote_args``."""
    named = inspect.signature(ray.data.read_parquet).parameters
    return dict(remote_args) if all(k in named for k in remote_args) else {"ray_remote_args": remote_args}


__all__ = ["check_batches"]
