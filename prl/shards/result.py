"""What :func:`prl.shards.build.build_shards` returns: a typed :class:`ShardResult` with its exit code and JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prl.errors import ExitCode
from prl.shards.options import ShardOptions
from prl.shards.plan import Plan


@dataclass
class ShardResult:
    """What :func:`build_shards` did. ``status``: ``built``, ``nothing_new``, ``all_dropped`` (every sample was
    dropped and none ever shipped into ``OUT``: exit 1) or ``dry_run``."""

    out: str
    status: str
    set_id: str | None = None
    set_dir: str | None = None
    manifest_path: str | None = None
    """Where the set's ``manifest.json`` is (``OUT/.prl/sets/<set-id>/``, :mod:`prl.shards.layout`)."""
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
            "drops": self.drops,
            "statistics": self.statistics,
            "source_versions": self.source_versions,
            "traces_scan": self.traces_scan,
            "headline": self.headline(),
            "exit_code": self.exit_code,
        }

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
            return line
        return (
            f"build-shards {self.status}: {self.rows:,} samples, {self.tokens:,} tokens in {len(self.shards)} "
            f"shards, {sum(self.drops.values()):,} dropped" + (f" → {self.set_id}" if self.set_id else "")
        )

    def count(self, plan: Plan, options: ShardOptions) -> None:
        """Copy the plan's counts and flag a drop rate above ``options.max_drop_rate``."""
        self.considered = plan.considered
        self.already_shipped = plan.already_shipped
        self.traces_scan = {"from": plan.scan, "rows": plan.scanned}
        self.drops = plan.drops
        dropped = sum(plan.drops.values())
        denominator = plan.considered - plan.already_shipped
        # every sample dropped and none ever shipped into OUT: the build cannot work as configured (exit 1); once
        # sets exist, samples dropped before are dropped again on every run and that is nothing new
        self.all_dropped = bool(denominator and dropped == denominator and not plan.already_shipped)
        self.score_names = sorted(options.rewards)
        self.drop_rate_exceeded = bool(
            options.max_drop_rate is not None and denominator and dropped / denominator > options.max_drop_rate
        )


__all__ = ["ShardResult"]
