"""The step kernel: the one runner every writing step goes through.

A step is an object (:class:`Step`) that says what its run needs and nothing about how it is run:

- ``lock``: the name of its lock in the store (``ingest``, ``check-tokens``, ...);
- ``plan(store, width)``: what to do, from the store's state, as a generator of :class:`Work`, one per commit
  (a group of sources, a run's verdicts, a shard set). ``width`` is the engine's :meth:`~prl.engines.Engine.width`,
  so the plan cuts each commit's work into as many tasks as the engine wants. The generator may hold what spans
  its works (a progress bar, a lent tokenizer) across its ``yield``: the runner closes it on any exception;
- ``commit(store, work, outputs)``: the store's commit protocol for one work, folding the tasks' outputs in the
  order the engine hands them back;
- ``finish(seconds)``: the typed result (:class:`~prl.results.CommandResult`), filled in by plan and commit.

:func:`execute` does the rest, the same for every step: the lock and the run view (:func:`prl.store.locks.running`,
no lock in a dry run), the dispatch of each work's tasks (``engine.map``), the commit of each work as its outputs
come back, and the result's time. A step never asks which engine it runs on, and no engine knows a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, nullcontext
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from prl.engines import Engine, get_engine
from prl.store.locks import running
from prl.store.tables import Store

R = TypeVar("R", covariant=True)


@dataclass(frozen=True)
class Work:
    """One commit's worth of a step's work. ``task``: the function that does one task (module level, or a
    ``functools.partial`` of one, so that any engine can ship it); ``tasks``: the tasks, plain picklable values
    (none: the commit does the work alone); ``gpu``, ``threads``: as :meth:`~prl.engines.Engine.map` takes them;
    ``around``: a context the tasks run and the commit happens in (a registry that lends the driver's state to
    tasks run in its process); ``state``: what the step's commit needs of its plan."""

    task: Callable[[Any], Iterable[Any]] | None = None
    tasks: Sequence[Any] = ()
    gpu: bool = False
    threads: int = 1
    around: Callable[[], AbstractContextManager[object]] = nullcontext
    state: Any = None


class Step(Protocol, Generic[R]):
    """A writing step as :func:`execute` runs it (see the module docstring)."""

    @property
    def lock(self) -> str: ...

    @property
    def dry_run(self) -> bool: ...

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]: ...

    def commit(self, store: Store, work: Work, outputs: Iterator[Any]) -> None: ...

    def finish(self, seconds: float) -> R: ...


def execute(
    step: Step[R],
    store: Store,
    engine: Engine | str | None = None,
    *,
    lock: bool = True,
    started: float | None = None,
) -> R:
    """Run ``step`` on ``store``: hold its lock and run view (none in a dry run, or when not ``lock``), take its
    plan's works in order, map each work's tasks on ``engine`` (:func:`prl.engines.get_engine`: an engine, its
    name, or None for the local engine) and commit the work as its outputs come back.
    Returns the step's result, timed from ``started`` (a :func:`time.perf_counter` reading: when the command
    began, its options checked and its sources listed), else from here."""
    started = time.perf_counter() if started is None else started
    engine = get_engine(engine)
    with (
        running(store, step.lock, enabled=lock and not step.dry_run),
        closing(step.plan(store, engine.width)) as works,
    ):
        for work in works:
            with work.around():
                outputs: Iterator[Any] = (
                    engine.map(work.task, work.tasks, gpu=work.gpu, threads=work.threads)
                    if work.task is not None and work.tasks
                    else iter(())
                )
                step.commit(store, work, outputs)
            del work, outputs  # the next work is planned without this one's state held
    return step.finish(time.perf_counter() - started)


__all__ = ["Step", "Work", "execute"]
