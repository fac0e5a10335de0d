"""The step kernel (prl.kernel.execute): lock and run view, works in order, tasks mapped on the engine, each work
committed with its own outputs, the plan closed on any error, the result timed."""

from __future__ import annotations

import functools
import gc
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from prl.engines import LocalEngine
from prl.errors import LockedError, UsageError
from prl.kernel import Work, execute
from prl.store.locks import holding
from prl.store.tables import Store


def _squares(scale: int, task: list[int]) -> Iterator[int]:
    for n in task:
        yield scale * n * n


@dataclass
class _Toy:
    """A step of two works (the second planned after the first committed), and one with no tasks."""

    dry_run: bool = False
    lock: str = "toy"
    fail_in_commit: int | None = None
    locked: bool | None = True
    """Whether commit finds its lock held (None: not looked at)."""
    log: list[Any] = field(default_factory=list)
    seconds: float = -1.0

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        self.log.append(("plan", width(4)))
        try:
            for scale in (1, 10):
                yield Work(functools.partial(_squares, scale), [[1, 2], [3]], state=scale)
                self.log.append(("after", scale))
            yield Work(state="alone")
        finally:
            self.log.append("closed")

    def commit(self, store: Store, work: Work, outputs: Iterator[int]) -> None:
        if self.locked is True:  # the step's lock is held while it commits
            with pytest.raises(LockedError), holding(store.uri, self.lock):
                pass
        elif self.locked is False:  # none is: this one is taken and let go
            with holding(store.uri, self.lock):
                pass
        got = sorted(outputs)
        if work.state == self.fail_in_commit:
            raise UsageError("stop")
        self.log.append(("commit", work.state, got))

    def finish(self, seconds: float) -> _Toy:
        self.seconds = seconds
        return self


class _Wide(LocalEngine):
    """Wants as many tasks as items."""

    def width(self, items: int, *, threads: int = 1) -> int:
        return items


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(str(tmp_path / "s"))


def test_each_work_is_mapped_and_committed_with_its_own_outputs_in_order(store):
    step = execute(_Toy(), store, _Wide())
    assert step.log == [
        ("plan", 4),
        ("commit", 1, [1, 4, 9]),
        ("after", 1),
        ("commit", 10, [10, 40, 90]),
        ("after", 10),
        ("commit", "alone", []),
        "closed",
    ]
    assert step.seconds >= 0
    with holding(store.uri, "toy"):  # released once the run ends
        pass


def test_the_local_engine_is_the_default_and_the_width_is_the_engines(store):
    assert execute(_Toy(), store).log[0] == ("plan", 1)


def test_a_dry_run_takes_no_lock(store):
    step = execute(_Toy(dry_run=True, locked=False), store)
    assert [entry[0] for entry in step.log if isinstance(entry, tuple)] == [
        "plan",
        "commit",
        "after",
        "commit",
        "after",
        "commit",
    ]


def test_a_failed_commit_closes_the_plan_at_once_and_releases_the_lock(store):
    step = _Toy(fail_in_commit=10)
    with pytest.raises(UsageError, match="stop"):
        execute(step, store)
    assert step.log == [("plan", 1), ("commit", 1, [1, 4, 9]), ("after", 1), "closed"]
    assert step.seconds == -1.0  # no result
    with holding(store.uri, "toy"):
        pass


def test_a_step_whose_lock_is_held_does_not_plan(store):
    step = _Toy()
    with holding(store.uri, "toy"):
        with pytest.raises(LockedError):
            execute(step, store)
        assert step.log == []
        beside = execute(_Toy(locked=None), store, lock=False)  # lock=False: it runs beside the holder
    assert beside.log[-1] == "closed"


def test_the_result_is_timed_from_started_when_given(store):
    started = time.perf_counter() - 100.0
    assert execute(_Toy(), store, started=started).seconds >= 100.0


class _Big:
    """A work's state that the next work must not find held."""


@dataclass
class _Turns:
    dry_run: bool = False
    lock: str = "turns"
    held: list[bool] = field(default_factory=list)

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        for _ in range(3):
            state = _Big()
            ref = weakref.ref(state)
            yield Work(functools.partial(_squares, 1), [[1]], state=state)
            del state
            gc.collect()
            self.held.append(ref() is not None)

    def commit(self, store: Store, work: Work, outputs: Iterator[int]) -> None:
        assert list(outputs) == [1]

    def finish(self, seconds: float) -> _Turns:
        return self


def test_a_work_is_let_go_before_the_next_is_planned(store):
    assert execute(_Turns(), store).held == [False, False, False]


@dataclass
class _Around:
    dry_run: bool = False
    lock: str = "around"
    log: list[str] = field(default_factory=list)

    @contextmanager
    def lent(self) -> Iterator[None]:
        self.log.append("enter")
        yield
        self.log.append("exit")

    def _task(self, task: int) -> Iterator[str]:
        self.log.append(f"task {task}")
        yield f"out {task}"

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        yield Work(self._task, [1, 2], around=self.lent)
        self.log.append("planned")

    def commit(self, store: Store, work: Work, outputs: Iterator[str]) -> None:
        self.log.extend(outputs)
        self.log.append("commit")

    def finish(self, seconds: float) -> _Around:
        return self


def test_the_tasks_run_and_the_work_commits_inside_its_around_context(store):
    assert execute(_Around(), store).log == [
        "enter",
        "task 1",
        "out 1",
        "task 2",
        "out 2",
        "commit",
        "exit",
        "planned",
    ]
