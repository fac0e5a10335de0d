"""What an engine does for the steps: run their per-batch functions somewhere and hand the results back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prl.checks.remote import CheckedBatch, CheckJob
    from prl.ingestion.remote import IngestJob, UnitRead
    from prl.score.remote import ScoreJob
    from prl.score.scored import ScoredBatch
    from prl.shards.parts import PartJob, PartWritten


class Engine(Protocol):
    """Runs the per-batch work of a step. The ``local`` engine's steps run their own threads and never call
    these methods; another engine implements them."""

    @property
    def name(self) -> str:
        """``local``, ``ray``: what ``--engine`` calls it."""
        ...

    def write_parts(self, job: PartJob) -> list[PartWritten]:
        """Write every part of ``job`` (:meth:`PartJob.write_published`, published in place); any order."""
        ...

    def check_batches(self, job: CheckJob) -> Iterator[CheckedBatch]:
        """Check every pending row of ``job`` in batches; yields each batch's verdicts as it is done."""
        ...

    def read_units(self, job: IngestJob) -> Iterator[UnitRead]:
        """Read the files of one ingest commit group in runs of consecutive files (:meth:`IngestJob.units`),
        each run's new rows written as data files; yields each run's read as it is done, in any order."""
        ...

    def score_files(self, job: ScoreJob) -> Iterator[ScoredBatch]:
        """Score every pending sample of ``job``'s traces files, batch by batch, each batch's rows written as a
        data file; yields each batch as it is done, in any order."""
        ...
