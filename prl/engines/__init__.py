"""Where the batches of a step run (design.md §8): ``local`` (threads of this process, the default) or ``ray``
(tasks of a Ray cluster, through Ray Data).

An engine only decides where each batch runs. The steps plan, lock, validate and commit in the calling process
(the driver) with the same functions on every engine, and a batch is processed by the same function wherever it
runs, so the results are the same: the same rows in the store's tables, byte-identical shard sets.

``local`` needs nothing beyond prl's own dependencies; ``ray`` needs the ``prl[ray]`` extra and imports Ray only
when a step first uses it.
"""

from __future__ import annotations

from prl.engines.base import Engine
from prl.engines.local import LOCAL, LocalEngine
from prl.errors import UsageError

ENGINES = ("local", "ray")
"""The engine names ``--engine`` and a recipe's ``engine`` key take."""


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


__all__ = ["ENGINES", "LOCAL", "Engine", "LocalEngine", "get_engine"]
