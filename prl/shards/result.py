"""What :func:`prl.shards.build.build_shards` returns: a typed :class:`ShardResult` with its exit code and JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prl.errors import ExitCode
from prl.shards.options import ShardOptions
from prl.shards.plan import Plan
from prl.shards.statistics import kl_cap_warning
from prl.text import counted


@dataclass
class ShardResult:
    """What :func:`build_shards` did. ``status``: ``built``, ``nothing_new``, ``all_dropped`` (every sample was
    dropped and none ever shipped into ``OUT``: exit 1) or ``dry_run``."""

    out: str
    status: str
    set_id: str | None = None
    set_dir: str | None = None
    manifest_path: str | None = None
    """Where the set's ``manifest.json`` is (``.OUT.prl/sets/<set-id>/``, :mod:`prl.shards.layout`)."""
    rows: int = 0
    tokens: int = 0
    shards: list[dict[str, Any]] = field(default_factory=list)
    considered: int = 0
    already_shipped: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    statistics: dict[str, Any] = field(default_factory=dict)
    source_versions: dict[str, int | None] = field(default_factory=dict)
    drop_rate_exceeded: bool = False
    all_dropped: bool = False
    score_names: list[str] = field(default_factory=list)
    traces_scan: dict[str, Any] = field(default_factory=dict)
    """``{"from": "whole" | "frontier", "rows": traces rows read}`` (:mod:`prl.shards.frontier`)."""
    sets: list[dict[str, Any]] = field(default_factory=list)
    """Each set the build published, in turn (:mod:`prl.shards.turns`): ``set_id``, ``set_dir``,
    ``manifest_path``, ``rows``, ``tokens``, ``shards`` (how many). The other fields describe the build as a whole:
    ``set_id``, ``set_dir``, ``manifest_path``, ``shards`` and ``statistics`` are those of the last set."""
    shipped_samples: int = 0
    """Trace rows the build shipped (``rows`` counts merged rows with ``merge_turns``)."""
    pending_files: int = 0
    """Traces files a dry run leaves for later turns (a build takes every turn, so 0 after one)."""
    dropped_before: int | None = None
    """Of the samples dropped, those an earlier build (or turn) dropped too (None: not known, a whole scan)."""

    @property
    def exit_code(self) -> int:
        return int(ExitCode.DATA_PROBLEMS if self.drop_rate_exceeded or self.all_dropped else ExitCode.OK)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "build-shards",
            "out": self.out,
            "status": self.status,
            "set_id": self.set_id,
            "set_dir": self.set_dir,
            "manifest_path": self.manifest_path,
            "rows": self.rows,
            "tokens": self.tokens,
            "shards": self.shards,
            "considered": self.considered,
            "already_shipped": self.already_shipped,
            "dropped": sum(self.drops.values()),
            "dropped_before": self.dropped_before,
            "drops": self.drops,
            "statistics": self.statistics,
            "source_versions": self.source_versions,
            "traces_scan": self.traces_scan,
            "sets": self.sets,
            "pending_files": self.pending_files,
            "warnings": self.warnings(),
            "headline": self.headline(),
            "exit_code": self.exit_code,
        }

    def warnings(self) -> list[str]:
        """What a person should look at though the build went through: KL tokens at the k3 cap
        (:func:`prl.shards.statistics.kl_cap_warning`, the last set's)."""
        warning = kl_cap_warning(self.statistics.get("kl"))
        return [] if warning is None else [warning]

    def headline(self) -> str:
        """``build-shards built: 120 samples, 48,000 tokens in 2 shards, 3 dropped → <set id>``; when every sample
        was dropped, the top drop reason (``build-shards all_dropped: every new sample was dropped: 3 of 3 as
        missing_reward …``)."""
        if self.all_dropped and self.drops:
            reason, count = sorted(self.drops.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            line = f"build-shards all_dropped: every new sample was dropped: {count:,} of {sum(self.drops.values()):,}"
            line += f" as {reason}"
            if reason == "missing_reward":
                line += f" (the score uses reward {', '.join(self.score_names)})"
            if reason == "unchecked":
                line += (
                    " (no check-tokens verdict for them: run `prl check-tokens` on the store first, or set "
                    "require_checks=false to ship unchecked samples)"
                )
            return line
        if len(self.sets) > 1:
            shards = sum(int(s["shards"]) for s in self.sets)
            return (
                f"build-shards {self.status}: {counted(self.rows, 'sample')}, {counted(self.tokens, 'token')} in "
                f"{counted(shards, 'shard')} of {len(self.sets)} sets, {self._dropped()} → {self.set_id}"
            )
        return (
            f"build-shards {self.status}: {counted(self.rows, 'sample')}, {counted(self.tokens, 'token')} in "
            f"{counted(len(self.shards), 'shard')}, {self._dropped()}" + (f" → {self.set_id}" if self.set_id else "")
        )

    def _dropped(self) -> str:
        """``35 dropped``, saying how many of them an earlier build dropped too (when it is known and not 0)."""
        dropped = sum(self.drops.values())
        before = self.dropped_before or 0
        if not dropped or not before:
            return f"{dropped:,} dropped"
        if before == dropped:
            return f"{dropped:,} dropped (all dropped by an earlier build too)"
        return f"{dropped:,} dropped ({before:,} of them by an earlier build too)"

    @classmethod
    def of_turns(cls, turns: list[ShardResult], options: ShardOptions) -> ShardResult:
        """One result for a build of several turns (:mod:`prl.shards.turns`). Every turn reconsiders the rows the
        turns before it dropped, so the last turn's ``considered`` and ``drops`` are the build's; samples shipped
        before the build are the last turn's ``already_shipped`` less what the earlier turns shipped."""
        built = [t for t in turns if t.status == "built"]
        last = turns[-1]
        summaries = [
            {
                "set_id": t.set_id,
                "set_dir": t.set_dir,
                "manifest_path": t.manifest_path,
                "rows": t.rows,
                "tokens": t.tokens,
                "shards": len(t.shards),
            }
            for t in built
        ]
        if len(turns) == 1:
            last.sets = summaries
            return last
        result = built[-1] if built else last
        out = cls(
            out=last.out,
            status="built" if built else last.status,
            set_id=result.set_id,
            set_dir=result.set_dir,
            manifest_path=result.manifest_path,
            rows=sum(t.rows for t in built),
            tokens=sum(t.tokens for t in built),
            shards=result.shards,
            considered=last.considered,
            already_shipped=last.already_shipped - sum(t.shipped_samples for t in turns[:-1]),
            drops=last.drops,
            statistics=result.statistics,
            source_versions=last.source_versions,
            all_dropped=last.all_dropped and not built,
            score_names=last.score_names,
            traces_scan={**turns[0].traces_scan, "rows": sum(int(t.traces_scan.get("rows", 0)) for t in turns)},
            shipped_samples=sum(t.shipped_samples for t in turns),
            sets=summaries,
            dropped_before=last.dropped_before,
        )
        out.drop_rate_exceeded = out._drop_rate_exceeded(options)
        return out

    def count(self, plan: Plan, options: ShardOptions) -> None:
        """Copy the plan's counts and flag a drop rate above ``options.max_drop_rate``."""
        self.considered = plan.considered
        self.already_shipped = plan.already_shipped
        self.traces_scan = {"from": plan.scan, "rows": plan.scanned}
        self.drops = plan.drops
        self.dropped_before = plan.dropped_before
        dropped = sum(plan.drops.values())
        denominator = plan.considered - plan.already_shipped
        # every sample dropped and none ever shipped into OUT: the build cannot work as configured (exit 1); once
        # sets exist, samples dropped before are dropped again on every run and that is nothing new
        self.all_dropped = bool(denominator and dropped == denominator and not plan.already_shipped)
        self.score_names = sorted(options.rewards)
        self.drop_rate_exceeded = self._drop_rate_exceeded(options)

    def _drop_rate_exceeded(self, options: ShardOptions) -> bool:
        """More than ``options.max_drop_rate`` of the samples considered and not shipped before were dropped."""
        dropped = sum(self.drops.values())
        denominator = self.considered - self.already_shipped
        return bool(options.max_drop_rate is not None and denominator and dropped / denominator > options.max_drop_rate)


__all__ = ["ShardResult"]
