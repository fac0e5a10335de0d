"""The ``local`` engine: a step's tasks run in this process (the default)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class LocalEngine:
    """This process: the tasks run one after another, each task's results handed back as they come."""

    name: str = "local"

    @property
    def in_process(self) -> bool:
        return True

    def width(self, items: int) -> int:
        return 1 if items else 0

    def map(self, fn: Callable[[T], Iterable[R]], tasks: Sequence[T], *, gpu: bool = False) -> Iterator[R]:
        for task in tasks:
            yield from fn(task)


LOCAL = LocalEngine()
"""The default engine."""

__all__ = ["LOCAL", "LocalEngine"]
