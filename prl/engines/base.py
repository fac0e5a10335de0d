"""What an engine does for a step: run one function over a list of tasks somewhere, and hand the results back.

An engine knows no step. A step cuts its work into tasks (plain, picklable values), names the function that does
one task (a module-level function, or a ``functools.partial`` of one), and folds the results in this process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Engine(Protocol):
    """Where a step's tasks run."""

    @property
    def name(self) -> str:
        """``local``, ``ray``: what ``--engine`` calls it."""
        ...

    def width(self, items: int, *, threads: int = 1) -> int:
        """How many tasks ``items`` units of work are best cut into here: none for no items, else at least one and
        at most ``items`` (``threads``: as :meth:`map` takes it)."""
        ...

    def map(
        self, fn: Callable[[T], Iterable[R]], tasks: Sequence[T], *, gpu: bool = False, threads: int = 1
    ) -> Iterator[R]:
        """Every result of ``fn`` over ``tasks``: each task's results in order, the tasks in the order they
        finish. ``gpu``: a task takes one GPU where the engine has GPUs. ``threads``: how many of the tasks may
        run at once on threads of one process (their heavy parts release the GIL). A
        :class:`~prl.errors.PrlError` that a task raises is raised here as itself."""
        ...
