"""``prl run RECIPE``: the steps a recipe names, in order, incrementally — what cron calls.

ingest → rewards → ref → check → score_ref → shards → maintain. Each step is the library call its command makes, and each commits
atomically on its own (Delta commits for the store tables, rename-published shard sets), so a run killed at any
instant keeps what its finished commits wrote and the next run picks up the rest: files already in the ingest
ledger are skipped, checked samples are not checked again, shipped samples are not shipped again.

Locks: the whole run holds the store's ``run`` lock, so a second ``prl run`` on the same store exits 3 at once,
naming the holder; each writing step also takes its own lock (``ingest``, ``ingest-rewards``,
``ingest-ref_logprobs``, ``check-tokens``, ``score-ref``, ``build-shards-<OUT digest>``, ``maintain``), so hand-run commands cannot collide with
a run either. A dry run takes no lock and writes nothing.

Exit code of a run: when a step fails (locked, bad configuration, I/O trouble) or the run is interrupted, the run
stops there and that step's code is the run's (3, 2, 5, 130); otherwise the largest of the steps' codes (0, 1,
or 2 when some input file had an unknown format).
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass, field, fields
from typing import Any

from prl.errors import ExitCode, PrlError, RetryableIOError, UsageError
from prl.pipeline import recipe as recipes
from prl.pipeline.recipe import Recipe
from prl.pipeline.steps import BY_NAME, RecipeStep
from prl.results import CommandResult, one_line
from prl.store.locks import holding
from prl.store.resolve import open_store
from prl.store.tables import Store

log = logging.getLogger(__name__)

RUN_LOCK = "run"


@dataclass
class StepResult:
    """One step of a run. ``status``: ``done``, ``failed`` (a :class:`PrlError`), ``interrupted`` or
    ``not_run`` (an earlier step stopped the run). ``summary`` is the step's own ``--json`` summary."""

    step: str
    status: str
    exit_code: int = 0
    seconds: float = 0.0
    summary: dict[str, Any] | None = None
    error: str | None = None
    result_headline: str | None = None
    """The step's own result's :meth:`~prl.results.CommandResult.headline`, when it finished."""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "summary": self.summary,
            "headline": self.headline(),
            "error": self.error,
        }

    def headline(self) -> str:
        """The step's result in one line: its result's headline, its error, or its status."""
        return self.error or self.result_headline or self.status


@dataclass
class RunResult:
    """What :func:`run` did, step by step."""

    recipe: str | None
    store: str
    dry_run: bool = False
    steps: list[StepResult] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    """Why the run stopped before its first step (the run lock), if it did."""
    error_code: int | None = None

    @property
    def exit_code(self) -> int:
        """The stopping step's code if one stopped the run, else the worst step code (docs/design.md)."""
        if self.error_code is not None:
            return self.error_code
        for step in self.steps:
            if step.status in ("failed", "interrupted"):
                return step.exit_code
        return max((step.exit_code for step in self.steps), default=int(ExitCode.OK))

    def step(self, name: str) -> StepResult:
        for step in self.steps:
            if step.step == name:
                return step
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "run",
            "recipe": self.recipe,
            "store": self.store,
            "dry_run": self.dry_run,
            "steps": [s.to_json() for s in self.steps],
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "exit_code": self.exit_code,
        }

    def headline(self) -> str:
        if self.error:
            return one_line(f"run stopped: {self.error}")
        steps = ", ".join(f"{s.step} {s.status}" for s in self.steps) or "no steps"
        dry = " (dry run)" if self.dry_run else ""
        return f"run{dry}: {steps}; exit {self.exit_code} after {self.seconds:.2f}s"


# --- the steps -----------------------------------------------------------------------------------------------
def call_step(step: RecipeStep, recipe: Recipe, store: Store, dry_run: bool) -> CommandResult:
    """Run ``step`` of ``recipe`` on ``store``: its library call (:attr:`RecipeStep.function`, imported here, so a recipe
    loads nothing a step it lacks needs) with the store, ``dry_run``, its table's fields as keywords (or, for a
    ``whole`` step, the table as ``options`` and the ``[store]`` out as ``out``), the ``[store]`` engine where the
    step takes one, and its fixed keywords."""
    module, name = step.function.split(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(
            f"this installation lacks {module}.{name} for [{step.name}]; drop [{step.name}] from the recipe or run "
            "the other steps with --only"
        ) from exc
    section = getattr(recipe, step.name)
    if step.whole:
        kwargs: dict[str, Any] = {"options": section, "out": recipe.store.out}
    else:
        kwargs = {f.name: _arg(getattr(section, f.name)) for f in fields(section)}
    if step.engine:
        kwargs["engine"] = recipe.store.engine
    result: CommandResult = fn(store=store, dry_run=dry_run, **kwargs, **step.fixed)
    return result


def _arg(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# --- the run -------------------------------------------------------------------------------------------------
def run(recipe: str | Recipe, *, dry_run: bool = False, steps: list[str] | tuple[str, ...] | None = None) -> RunResult:
    """Run the steps of ``recipe`` (a TOML path or a :class:`Recipe`), or only ``steps`` of them, in order.

    Returns a :class:`RunResult`; step failures (:class:`PrlError`, I/O errors) and interrupts (Ctrl-C,
    SIGTERM raised as ``KeyboardInterrupt``) are recorded in it, not raised, and stop the run. Raises
    :class:`UsageError` only for a bad recipe or step name, before anything runs.
    """
    loaded = recipes.load(recipe) if isinstance(recipe, str) else recipe
    chosen = recipes.resolve_steps(steps, loaded)
    result = RunResult(recipe=loaded.path, store=loaded.store.uri, dry_run=dry_run)
    started = time.perf_counter()
    try:
        may_create = any(name in chosen for name in ("ingest", "rewards", "ref"))
        store = open_store(loaded.store.uri, create=may_create, writing=not dry_run)
        with holding(store.uri, RUN_LOCK, enabled=not dry_run):
            _run_steps(loaded, store, chosen, dry_run, result)
    except PrlError as exc:  # the run lock is held, or the store is unusable (a file, permission denied)
        result.error, result.error_code = str(exc), int(exc.exit_code)
    except KeyboardInterrupt:
        result.error, result.error_code = "interrupted", int(ExitCode.INTERRUPTED)
    result.seconds = time.perf_counter() - started
    return result


def _run_steps(recipe: Recipe, store: Store, chosen: tuple[str, ...], dry_run: bool, result: RunResult) -> None:
    stopped = False
    for name in chosen:
        if stopped:
            result.steps.append(StepResult(name, "not_run"))
            continue
        step = StepResult(name, "done")
        result.steps.append(step)
        started = time.perf_counter()
        log.info("step %s: started", name)
        try:
            outcome = call_step(BY_NAME[name], recipe, store, dry_run)
            step.summary = outcome.to_json()
            step.exit_code = int(outcome.exit_code)
            step.result_headline = outcome.headline()
        except PrlError as exc:
            step.status, step.exit_code, step.error = "failed", int(exc.exit_code), str(exc)
        except OSError as exc:
            wrapped = RetryableIOError(f"{name}: {exc}")
            step.status, step.exit_code, step.error = "failed", int(wrapped.exit_code), str(wrapped)
        except KeyboardInterrupt:
            step.status, step.exit_code = "interrupted", int(ExitCode.INTERRUPTED)
            step.error = "interrupted: committed work is kept, uncommitted work is invisible"
        step.seconds = time.perf_counter() - started
        log.info("step %s: %s (exit %d) in %.2fs", name, step.status, step.exit_code, step.seconds)
        stopped = step.status != "done"


__all__ = ["RunResult", "StepResult", "call_step", "run"]
