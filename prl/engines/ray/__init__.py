"""The ``ray`` engine: the batches of a step run as Ray Data tasks on a Ray cluster (the ``prl[ray]`` extra).

The driver (the process running the step) joins the cluster at :attr:`RayEngine.address`, or at ``RAY_ADDRESS``
when that is None, exactly as ``ray.init`` does (with neither, ``ray.init`` starts a local Ray instance).
Everything that decides a step's result stays in the driver: the plan, the lock, the validation and the one
atomic commit or publication. Workers read the store, the sources and the spills, and write files, at the same
paths the driver uses: with a local store or output folder, every node of the cluster must see it at that path (a
shared filesystem). Each step's tasks get the driver's standard credentials in their runtime environment
(:meth:`RayEngine.remote_args`: the ``AWS_*`` variables for an ``s3://`` store or source, and the scoring
endpoints' keys), so a worker reads and writes S3 as the driver does.

Ray is imported when a step first needs it, never by ``import prl``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from prl.errors import PrlError, UsageError

if TYPE_CHECKING:
    from prl.checks.remote import CheckedBatch, CheckJob
    from prl.ingestion.remote import IngestJob, UnitRead
    from prl.score.remote import ScoreJob
    from prl.score.scored import ScoredBatch
    from prl.shards.parts import PartJob, PartWritten

FORWARDED_PREFIXES = ("AWS_",)
FORWARDED_NAMES = ("PRL_REF_API_KEY", "OPENAI_API_KEY", "TINKER_API_KEY", "TINKER_CREDENTIAL_CMD")
"""The driver's environment variables every task of a step gets: the standard AWS ones (credentials, profile,
endpoint, region) and the scoring endpoints' keys (:mod:`prl.score.http`, :mod:`prl.score.tinker`)."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or a :class:`~prl.errors.UsageError` saying how to install it."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise UsageError(f"--engine ray needs Ray Data: pip install 'prl[ray]' ({exc})") from exc
    return ray


@dataclass
class RayEngine:
    """A Ray cluster. ``partitions``: Ray Data blocks a step's work is cut into (None: the cluster's CPUs)."""

    address: str | None = None
    partitions: int | None = None
    name: str = "ray"

    def connect(self) -> ModuleType:
        """Join the cluster (once per process) and quiet Ray Data's progress output; returns ``ray``."""
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        return ray

    def blocks(self, items: int) -> int:
        """How many blocks to cut ``items`` work items into: ``partitions``, else the cluster's CPUs; at least
        one, at most ``items``."""
        ray = self.connect()
        wanted = self.partitions or int(ray.cluster_resources().get("CPU", 1))
        return max(1, min(items, wanted))

    def remote_args(self) -> dict[str, Any]:
        """Ray remote arguments of every task of a step: a runtime environment carrying the driver's
        :data:`FORWARDED_PREFIXES` / :data:`FORWARDED_NAMES` variables as they are now (none: no runtime
        environment, so tasks run in the cluster's shared worker processes)."""
        env = {
            name: value
            for name, value in os.environ.items()
            if name.startswith(FORWARDED_PREFIXES) or name in FORWARDED_NAMES
        }
        return {"runtime_env": {"env_vars": env}} if env else {}

    def rows(self, dataset: Any) -> Iterator[dict[str, Any]]:
        """The rows a step's tasks (each wrapped in :func:`reporting`) return, block by block as they finish. A
        prl error a task met is raised here as itself, so that the step exits with its code (Ray would wrap it
        in errors of its own and drop its type)."""
        for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            if ERROR_COLUMN in batch.schema.names:
                raise _rebuilt(batch.column(ERROR_COLUMN)[0].as_py())
            yield from batch.to_pylist()

    def write_parts(self, job: PartJob) -> list[PartWritten]:
        from prl.engines.ray.shards import write_parts

        return write_parts(self, job)

    def check_batches(self, job: CheckJob) -> Iterator[CheckedBatch]:
        from prl.engines.ray.checks import check_batches

        return check_batches(self, job)

    def read_units(self, job: IngestJob) -> Iterator[UnitRead]:
        from prl.engines.ray.ingest import read_units

        return read_units(self, job)

    def score_files(self, job: ScoreJob) -> Iterator[ScoredBatch]:
        from prl.engines.ray.score import score_files

        return score_files(self, job)


ERROR_COLUMN = "prl_error"
"""The one column of the block a task returns in place of its rows when it met a prl error (JSON: kind,
message)."""


def reporting(fn: Callable[..., pa.Table]) -> Callable[..., pa.Table]:
    """A task function that returns, in place of raising, the prl error ``fn`` met: a one-row block of
    :data:`ERROR_COLUMN` that :meth:`RayEngine.rows` raises again in the driver."""

    @functools.wraps(fn)
    def task(block: pa.Table, **kwargs: Any) -> pa.Table:
        try:
            return fn(block, **kwargs)
        except PrlError as exc:
            report = {"kind": type(exc).__name__, "message": str(exc)}
            return pa.table({ERROR_COLUMN: [json.dumps(report)]})

    return task


def _rebuilt(report: str) -> PrlError:
    """The prl error a task reported (its class from :mod:`prl.errors`, its message)."""
    from prl import errors

    fields = json.loads(report)
    kind = getattr(errors, str(fields.get("kind")), None)
    cls = kind if isinstance(kind, type) and issubclass(kind, PrlError) else PrlError
    return cls(fields.get("message", "a Ray task failed"))


__all__ = ["RayEngine", "import_ray"]
