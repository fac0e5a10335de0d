"""The ``local`` engine: a step's tasks run in this process (the default)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class LocalEngine:
    """This process: the tasks run one after another, each task's results handed back as they come, or, where
    ``threads`` of them may run at once, one task per unit of work on that many threads."""

    name: str = "local"

    def width(self, items: int, *, threads: int = 1) -> int:
        """One task (its results stream back), or with ``threads`` one task per item, for the threads to share."""
        if not items:
            return 0
        return 1 if threads <= 1 else items

    def map(
        self, fn: Callable[[T], Iterable[R]], tasks: Sequence[T], *, gpu: bool = False, threads: int = 1
    ) -> Iterator[R]:
        if threads <= 1 or len(tasks) <= 1:
            for task in tasks:
                yield from fn(task)
            return
        with ThreadPoolExecutor(max_workers=threads) as pool:
            running = [pool.submit(lambda task: list(fn(task)), task) for task in tasks]
            try:
                for done in as_completed(running):
                    yield from done.result()
            finally:
                for future in running:
                    future.cancel()


LOCAL = LocalEngine()
"""The default engine."""

__all__ = ["LOCAL", "LocalEngine"]
