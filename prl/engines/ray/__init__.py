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

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

from prl.errors import PrlError, UsageError

T = TypeVar("T")
R = TypeVar("R")

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
    """A Ray cluster. ``partitions``: how many tasks a step's work is cut into (None: the cluster's CPUs)."""

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

    def width(self, items: int, *, threads: int = 1) -> int:
        """``partitions``, else the cluster's CPUs: none for no items, else at least one and at most ``items``
        (``threads`` plays no part: each task runs where Ray puts it)."""
        if items < 1:
            return 0
        wanted = self.partitions or int(self.connect().cluster_resources().get("CPU", 1))
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

    def map(
        self, fn: Callable[[T], Iterable[R]], tasks: Sequence[T], *, gpu: bool = False, threads: int = 1
    ) -> Iterator[R]:
        """One Ray Data block per task, run by ``map_batches`` on the cluster's workers; each task's results come
        back as one row (Ray Data carries them as Python objects). A prl error a task met is raised here as
        itself, so that the step exits with its code (Ray would wrap it in errors of its own and drop its type)."""
        if not tasks:
            return
        ray = self.connect()
        resources = self.remote_args()
        if gpu and ray.cluster_resources().get("GPU", 0) >= 1:
            resources["num_gpus"] = 1
        items = ray.data.range(len(tasks), override_num_blocks=len(tasks))
        done = items.map_batches(
            _run_tasks, fn_kwargs={"fn": fn, "tasks": list(tasks)}, batch_format="numpy", batch_size=1, **resources
        )
        for batch in done.iter_batches(batch_format="numpy", batch_size=None):
            for outcome in batch[RESULT_COLUMN]:
                kind, value = outcome
                if kind == "error":
                    raise _rebuilt(value)
                yield from value


RESULT_COLUMN = "prl_result"
"""The one column of the rows the tasks return: ``("ok", [results...])``, or ``("error", report)`` when the task met
a prl error (JSON: kind, message)."""


def _run_tasks(batch: dict[str, np.ndarray], fn: Callable[[Any], Iterable[Any]], tasks: list[Any]) -> dict[str, Any]:
    """A worker's part: the tasks numbered in ``batch["id"]``, each run to the end; one outcome row each."""
    outcomes = np.empty(len(batch["id"]), dtype=object)
    for row, number in enumerate(batch["id"]):
        try:
            outcomes[row] = ("ok", list(fn(tasks[int(number)])))
        except PrlError as exc:
            outcomes[row] = ("error", json.dumps({"kind": type(exc).__name__, "message": str(exc)}))
    return {RESULT_COLUMN: outcomes}


def _rebuilt(report: str) -> PrlError:
    """The prl error a task reported (its class from :mod:`prl.errors`, its message)."""
    from prl import errors

    fields = json.loads(report)
    kind = getattr(errors, str(fields.get("kind")), None)
    cls = kind if isinstance(kind, type) and issubclass(kind, PrlError) else PrlError
    return cls(fields.get("message", "a Ray task failed"))


__all__ = ["RayEngine", "import_ray"]
