"""Where the tasks of a step run: ``local`` (this process, the default) or ``ray`` (a Ray cluster, through Ray
Data). An engine is a ``map`` of a function over tasks and knows no step.

An engine only decides where each task runs. The steps plan, lock, validate and commit in the calling process
(the driver) with the same functions on every engine, and a task is done by the same function wherever it runs,
so the results are the same: the same rows in the store's tables, byte-identical shard sets.

``local`` needs nothing beyond prl's own dependencies; ``ray`` needs the ``prl[ray]`` extra and imports Ray only
when a step first uses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TypeVar

from prl.engines.base import Engine
from prl.engines.local import LOCAL, LocalEngine
from prl.errors import UsageError
from prl.options import ENGINES


def get_engine(engine: Engine | str | None = None) -> Engine:
    """The engine named ``engine`` (None: ``local``); an :class:`Engine` is returned as it is. ``ray`` joins the
    cluster at ``RAY_ADDRESS`` (as ``ray.init`` does) when a step first needs it. Raises
    :class:`~prl.errors.UsageError` for an unknown name."""
    if engine is None or engine == "local":
        return LOCAL
    if engine == "ray":
        from prl.engines.ray import RayEngine

        return RayEngine()
    if isinstance(engine, str):
        raise UsageError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    return engine


T = TypeVar("T")


def split(items: Sequence[T], parts: int) -> list[list[T]]:
    """``items`` cut into at most ``parts`` runs of consecutive items, as equal in count as they can be (none
    empty)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    cuts = [0]
    for i in range(parts):
        cuts.append(cuts[-1] + size + (1 if i < extra else 0))
    return [list(items[a:b]) for a, b in itertools.pairwise(cuts) if b > a]


__all__ = ["ENGINES", "LOCAL", "Engine", "LocalEngine", "get_engine", "split"]
