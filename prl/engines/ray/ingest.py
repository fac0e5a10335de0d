"""ingest on Ray: each run of consecutive source files of a commit group is read by a Ray Data task.

The driver plans the group (:mod:`prl.ingestion.traces`); here its runs of files (:meth:`IngestJob.units`, one
per block of :meth:`RayEngine.blocks`) become a Ray Data dataset of ``(lo, hi)`` rows, and ``map_batches`` runs
:func:`prl.ingestion.remote.read_block` on each: the local engine's own reader, writing the files' new rows as
``traces`` data files. Only each run's summary comes back (the files written, reports, ledger entries, quarantine
and reward rows, the sample IDs kept); the driver folds them in file order and commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prl.engines.ray import reporting
from prl.ingestion.remote import IngestJob, UnitRead, read_block

if TYPE_CHECKING:
    from prl.engines.ray import RayEngine


def read_units(engine: RayEngine, job: IngestJob) -> Iterator[UnitRead]:
    """Every run of files of ``job`` read on the cluster; the reads in the order they finish."""
    if not job.files:
        return
    ray = engine.connect()
    units = job.units(engine.blocks(len(job.files)))
    items = ray.data.from_items([{"lo": lo, "hi": hi} for lo, hi in units], override_num_blocks=len(units))
    reads = items.map_batches(
        reporting(read_block), fn_kwargs={"job": job}, batch_format="pyarrow", batch_size=1, **engine.remote_args()
    )
    for row in engine.rows(reads):
        yield UnitRead.from_row(row)


__all__ = ["read_units"]
