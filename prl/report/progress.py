"""Progress of long work on a console: a rich bar on a terminal, log lines elsewhere (:mod:`prl.progress`)."""

from __future__ import annotations

import logging
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from prl.progress import LOG, LogSink, Sink, Task, amount


class BarSink:
    """A rich progress bar per task on ``console`` (removed when the task ends): the amount done of the total,
    the side counts, the rate and the time left."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bars: dict[int, tuple[Any, Any]] = {}

    def start(self, task: Task) -> None:
        bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[amount]}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        bar.start()
        self._bars[id(task)] = (bar, bar.add_task(task.label, total=task.total, amount=_bar_text(task)))

    def update(self, task: Task) -> None:
        found = self._bars.get(id(task))
        if found is not None:
            bar, key = found
            bar.update(key, completed=task.done, total=task.total, amount=_bar_text(task))

    def stop(self, task: Task) -> None:
        found = self._bars.pop(id(task), None)
        if found is not None:
            found[0].stop()


def for_console(console: Console, seconds: float | None = None) -> Sink:
    """A :class:`BarSink` on ``console`` when it is a terminal, else a :class:`LogSink`."""
    if console.is_terminal:
        return BarSink(console)
    LOG.setLevel(logging.INFO)  # shown without -v: the root logger's handler prints what reaches it
    return LogSink(seconds)


def _bar_text(task: Task) -> str:
    """``2.0 MB of 4.0 MB  files 5/13  1.3 MB/s``: beside the bar."""
    text = [amount(task.done, task.unit, task.total)]
    text.extend(
        f"{name} {k:,}" + ("" if task.totals.get(name) is None else f"/{task.totals[name]:,}")
        for name, k in task.counts.items()
    )
    text.append(amount(task.rate(), task.unit, per_second=True))
    return "  ".join(text)


__all__ = ["BarSink", "for_console"]
