"""Progress of long work, for the people who wait on it.

A stage opens a :func:`task` and advances it once per batch (never per record): the bytes and files an ingest
has read, the samples check-tokens and score-ref have done, the shards and turns of a build. Where the counts go
is the caller's choice, made once around the work with :func:`reporting`:

- :class:`prl.report.progress.BarSink`: a rich progress bar (rate and time left), for a terminal;
- :class:`LogSink`: one log line every ``interval`` seconds (``PRL_PROGRESS_INTERVAL``, default 10) with the
  rate and the time left, for cron logs and anything else that is not a terminal;
- nothing (the default, and what a library user gets): :meth:`Task.advance` adds to two integers and returns.

:func:`prl.report.progress.for_console` picks the bar or the log lines for a console, as the command line does
around every command.
Both write to stderr, so the one JSON object of ``--json`` on stdout is never mixed with them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

INTERVAL_ENV = "PRL_PROGRESS_INTERVAL"
"""Seconds between two log lines of :class:`LogSink` (default :data:`INTERVAL`)."""
INTERVAL = 10.0
LOG = logging.getLogger("prl.progress")


class Sink(Protocol):
    """Where a task's counts go: told when it starts, after each advance, and when it ends."""

    def start(self, task: Task) -> None: ...

    def update(self, task: Task) -> None: ...

    def stop(self, task: Task) -> None: ...


class Task:
    """One stage's progress: ``done`` of ``total`` in ``unit`` (the bar, the rate and the time left), and side
    counts (``files``, ``turn``) shown beside it, each with its total where known (None: open-ended).
    Advancing it from several threads is safe."""

    def __init__(
        self,
        label: str,
        total: int | None,
        unit: str,
        counts: dict[str, int | None],
        sink: Sink | None,
        on_advance: Callable[[int], None] | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self.counts = dict.fromkeys(counts, 0)
        self.totals = dict(counts)
        self.started = time.monotonic()
        self._sink = sink
        self._on_advance = on_advance
        self._lock = threading.Lock()

    def advance(self, n: int = 0, **counts: int) -> None:
        """Add ``n`` to ``done`` and each of ``counts`` to its side count."""
        with self._lock:
            self.done += n
            for name, k in counts.items():
                self.counts[name] = self.counts.get(name, 0) + k
        if self._on_advance is not None and n:
            self._on_advance(n)
        if self._sink is not None:
            self._sink.update(self)

    def grow(self, n: int = 0, **totals: int) -> None:
        """Add ``n`` to the total (work found as it goes: the shards of each turn), and each of ``totals`` to a
        side count's total."""
        with self._lock:
            self.total = (self.total or 0) + n
            for name, k in totals.items():
                self.totals[name] = (self.totals.get(name) or 0) + k
        if self._sink is not None:
            self._sink.update(self)

    def rate(self, now: float | None = None) -> float:
        """Units done per second since the task started."""
        elapsed = (time.monotonic() if now is None else now) - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left at the rate so far; None without a total or a rate."""
        rate = self.rate(now)
        if self.total is None or rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / rate)

    def line(self, now: float | None = None) -> str:
        """``label: done of total unit (p%), side counts, rate, ETA`` as a log line says it."""
        now = time.monotonic() if now is None else now
        parts = [f"{self.label}: {amount(self.done, self.unit)}"]
        if self.total:
            parts[0] = f"{self.label}: {amount(self.done, self.unit, self.total)} ({self.done / self.total:.0%})"
        parts.extend(
            f"{name} {k:,}" + ("" if self.totals.get(name) is None else f" of {self.totals[name]:,}")
            for name, k in self.counts.items()
        )
        parts.append(f"{amount(self.rate(now), self.unit, per_second=True)}")
        eta = self.eta(now)
        parts.append(f"ETA {_clock(eta)}" if eta is not None else f"{_clock(now - self.started)} elapsed")
        return ", ".join(parts)


_SINK: ContextVar[Sink | None] = ContextVar("prl_progress_sink", default=None)


@contextmanager
def reporting(sink: Sink | None) -> Iterator[None]:
    """Send the counts of every :func:`task` opened in the block to ``sink`` (None: nowhere)."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


@contextmanager
def task(
    label: str,
    total: int | None = None,
    unit: str = "",
    *,
    on_advance: Callable[[int], None] | None = None,
    **counts: int | None,
) -> Iterator[Task]:
    """A :class:`Task` reporting to the sink :func:`reporting` set (none: it only counts). ``counts``: the side
    counts by name, each with its total or None. ``on_advance`` is called with each non-zero ``n`` advanced."""
    sink = _SINK.get()
    work = Task(label, total, unit, counts, sink, on_advance)
    if sink is not None:
        sink.start(work)
    try:
        yield work
    finally:
        if sink is not None:
            sink.stop(work)


def interval() -> float:
    """Seconds between log lines: ``PRL_PROGRESS_INTERVAL`` when it is a positive number, else 10."""
    try:
        seconds = float(os.environ.get(INTERVAL_ENV, ""))
    except ValueError:
        return INTERVAL
    return seconds if seconds > 0 else INTERVAL


class LogSink:
    """A log line (logger ``prl.progress``, level INFO, shown without ``-v``) every ``seconds`` while a task runs,
    and one when a task that logged ends; a task shorter than ``seconds`` logs nothing. With ``heartbeat`` (the
    default) a thread per task logs on time even while no batch ends (a long first batch, a model loading);
    without it, lines are due only as the task advances."""

    def __init__(
        self,
        seconds: float | None = None,
        logger: logging.Logger = LOG,
        clock: Callable[[], float] = time.monotonic,
        heartbeat: bool = True,
    ) -> None:
        self.seconds = interval() if seconds is None else seconds
        self.logger = logger
        self.clock = clock
        self.heartbeat = heartbeat
        self._next: dict[int, float] = {}
        self._logged: set[int] = set()
        self._beats: dict[int, tuple[threading.Event, threading.Thread]] = {}
        self._lock = threading.Lock()

    def start(self, task: Task) -> None:
        self._next[id(task)] = task.started + self.seconds
        if self.heartbeat:
            stop = threading.Event()
            beat = threading.Thread(target=self._beat, args=(task, stop), name="prl-progress", daemon=True)
            self._beats[id(task)] = (stop, beat)
            beat.start()

    def _beat(self, task: Task, stop: threading.Event) -> None:
        while not stop.wait(self.seconds):
            self.update(task)

    def update(self, task: Task) -> None:
        due = self._next.get(id(task))
        now = self.clock()
        if due is None or now < due:
            return
        with self._lock:  # the task's thread and its heartbeat: one line per interval
            if now < self._next.get(id(task), now + 1):
                return
            self._next[id(task)] = now + self.seconds
            self._logged.add(id(task))
        self.logger.info("%s", task.line(now))

    def stop(self, task: Task) -> None:
        beat = self._beats.pop(id(task), None)
        if beat is not None:
            beat[0].set()
            beat[1].join()
        self._next.pop(id(task), None)
        if id(task) in self._logged:
            self._logged.discard(id(task))
            now = self.clock()
            self.logger.info("%s, done in %s", task.line(now), _clock(now - task.started))


def amount(n: float, unit: str, total: int | None = None, per_second: bool = False) -> str:
    """``n`` (and ``of total``) in ``unit``: bytes in decimal multiples (``312.0 MB``), others as counts."""
    suffix = "/s" if per_second else ""
    if unit == "bytes":
        text = _bytes(n) if total is None else f"{_bytes(n)} of {_bytes(total)}"
        return text + suffix
    if per_second:
        count = f"{n:,.1f}" if n < 100 else f"{n:,.0f}"
    else:
        count = f"{n:,.0f}" if total is None else f"{n:,.0f} of {total:,}"
    return f"{count} {unit}{suffix}".rstrip()


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _clock(seconds: float) -> str:
    """``h:mm:ss``."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


__all__ = ["INTERVAL_ENV", "LogSink", "Sink", "Task", "amount", "interval", "reporting", "task"]
