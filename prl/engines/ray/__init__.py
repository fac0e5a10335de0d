"""The ``ray`` engine: the batches of a step run as Ray Data tasks on a Ray cluster (the ``prl[ray]`` extra).

The driver (the process running the step) joins the cluster at :attr:`RayEngine.address`, or at ``RAY_ADDRESS``
when that is None, exactly as ``ray.init`` does (with neither, ``ray.init`` starts a local Ray instance).
Everything that decides a step's result stays in the driver: the plan, the lock, the validation and the one
atomic commit or publication. Workers read the store and the spills, and write files, at the same paths the
driver uses: with a local store or output folder, every node of the cluster must see it at that path (a shared
filesystem); an ``s3://`` store is read with credentials from each worker's standard environment.

Ray is imported when a step first needs it, never by ``import prl``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from prl.errors import UsageError

if TYPE_CHECKING:
    from prl.checks.remote import CheckedBatch, CheckJob
    from prl.shards.parts import PartJob, PartWritten


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

    def write_parts(self, job: PartJob) -> list[PartWritten]:
        from prl.engines.ray.shards import write_parts

        return write_parts(self, job)

    def check_batches(self, job: CheckJob) -> Iterator[CheckedBatch]:
        from prl.engines.ray.checks import check_batches

        return check_batches(self, job)


__all__ = ["RayEngine", "import_ray"]
