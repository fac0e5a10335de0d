"""The ``local`` engine: every step runs its batches on threads of this process (the default)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prl.checks.remote import CheckedBatch, CheckJob
    from prl.ingestion.remote import IngestJob, UnitRead
    from prl.score.remote import ScoreJob
    from prl.score.scored import ScoredBatch
    from prl.shards.parts import PartJob, PartWritten


@dataclass(frozen=True)
class LocalEngine:
    """This process. The steps recognise it by name and use their own thread pools."""

    name: str = "local"

    def write_parts(self, job: PartJob) -> list[PartWritten]:
        raise NotImplementedError("build-shards writes local parts on its own threads")

    def check_batches(self, job: CheckJob) -> Iterator[CheckedBatch]:
        raise NotImplementedError("check-tokens checks local batches itself")

    def read_units(self, job: IngestJob) -> Iterator[UnitRead]:
        raise NotImplementedError("ingest reads local groups itself")

    def score_files(self, job: ScoreJob) -> Iterator[ScoredBatch]:
        raise NotImplementedError("score-ref scores local batches itself")


LOCAL = LocalEngine()
"""The default engine."""

__all__ = ["LOCAL", "LocalEngine"]
