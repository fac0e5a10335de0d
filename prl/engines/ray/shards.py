"""build-shards on Ray: each part is gathered, assembled, written, fsynced and renamed by a Ray Data task.

The driver plans, scores and publishes (:mod:`prl.shards.build`); here the part numbers become a Ray Data
dataset of :meth:`RayEngine.blocks` blocks, and one ``map_batches`` task per block runs
:meth:`prl.shards.parts.PartJob.write_published` on each of its parts. Only each part's manifest entry and counts
come back; the parts stay where the tasks wrote them, in the build's staging folder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from prl.engines.ray import reporting
from prl.shards.parts import PartJob, PartWritten

if TYPE_CHECKING:
    from prl.engines.ray import RayEngine


def _write_block(batch: pa.Table, job: PartJob) -> pa.Table:
    """The parts numbered in ``batch["id"]``, written; one row of :meth:`PartWritten.to_row` each."""
    return pa.Table.from_pylist([job.write_published(int(s)) for s in batch.column("id").to_pylist()])


def write_parts(engine: RayEngine, job: PartJob) -> list[PartWritten]:
    """Write every part of ``job`` on the cluster; the parts written, in shard order."""
    ray = engine.connect()
    parts = ray.data.range(job.parts, override_num_blocks=engine.blocks(job.parts))
    rows = parts.map_batches(
        reporting(_write_block), fn_kwargs={"job": job}, batch_format="pyarrow", batch_size=None, **engine.remote_args()
    )
    written = [PartWritten.from_row(row) for row in engine.rows(rows)]
    return sorted(written, key=lambda w: w.shard)


__all__ = ["write_parts"]
