"""The typed result of a check run: what the CLI renders (``prl.report.checks``) or dumps (``--json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from prl.errors import ExitCode
from prl.options import CheckTokensOptions
from prl.verdicts import CHECK_FAMILIES, REASONS, SEVERITY

GROUP_COLUMNS = ("source_format", "model", "policy_version")


@dataclass
class Example:
    """One of the worst samples: verdict, reasons, first divergence and the evidence with decoded pieces."""

    sample_id: str
    verdict: str
    reasons: list[str]
    first_divergence: int | None
    detail: dict[str, Any]
    source_format: str | None = None
    model: str | None = None
    policy_version: str | None = None


@dataclass
class CheckResult:
    """Summary of one ``check_tokens`` run over the samples it checked (not the whole table).

    ``drift_rate`` = (drift + invalid, plus warn when ``allow_warn`` is False) / checked. ``exit_code`` is 1
    when ``max_drift_rate`` is set and the rate passes it, else 0.
    """

    store: str
    tokenizer: str
    fingerprint: str
    template: bool
    traces_version: int | None
    checks_version: int | None = None
    dry_run: bool = False
    checked: int = 0
    skipped_existing: int = 0
    sampled_out: int = 0
    verdicts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SEVERITY, 0))
    reasons: dict[str, int] = field(default_factory=dict)
    checks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECK_FAMILIES, 0))
    """Samples with at least one reason of each check family."""
    prefix: dict[str, int] = field(default_factory=lambda: {"CLEAN": 0, "REALIGN": 0, "FORK": 0})
    prefix_undetermined: dict[str, int] = field(default_factory=dict)
    """Why → multi-turn samples whose previous turn could not be determined (``prl.trajectory.UNDETERMINED``;
    reason ``prefix_unordered``): counted, never skipped silently."""
    groups: dict[str, dict[str, dict[str, int]]] = field(default_factory=lambda: {name: {} for name in GROUP_COLUMNS})
    """column → value → verdict counts (plus "checked")."""
    worst: list[Example] = field(default_factory=list)
    tokens: int = 0
    tokens_roundtripped: int = 0
    """Tokens that went through decode + encode; the rest were shared segments answered from the cache."""
    elapsed_s: float = 0.0
    max_drift_rate: float | None = None
    allow_warn: bool = CheckTokensOptions.allow_warn
    sample_rate: float = CheckTokensOptions.sample_rate

    # --- derived -------------------------------------------------------------------------------------------
    def _problems(self, counts: dict[str, int]) -> int:
        bad = counts.get("drift", 0) + counts.get("invalid", 0)
        return bad if self.allow_warn else bad + counts.get("warn", 0)

    @property
    def drift_rate(self) -> float:
        return self._problems(self.verdicts) / self.checked if self.checked else 0.0

    @property
    def check_rates(self) -> dict[str, float]:
        """Fraction of checked samples flagged by each check family."""
        return {k: (v / self.checked if self.checked else 0.0) for k, v in self.checks.items()}

    def group_rates(self) -> dict[str, dict[str, float]]:
        """column → value → drift rate of that slice."""
        return {
            col: {val: (self._problems(c) / c["checked"] if c["checked"] else 0.0) for val, c in vals.items()}
            for col, vals in self.groups.items()
        }

    @property
    def exit_code(self) -> int:
        if self.max_drift_rate is not None and self.drift_rate > self.max_drift_rate:
            return int(ExitCode.DATA_PROBLEMS)
        return int(ExitCode.OK)

    def to_json(self) -> dict[str, Any]:
        """The machine-readable summary (``--json``): every field plus the derived rates and exit code."""
        out = asdict(self)
        out["command"] = "check-tokens"
        out["drift_rate"] = self.drift_rate
        out["check_rates"] = self.check_rates
        out["group_rates"] = self.group_rates()
        out["exit_code"] = self.exit_code
        out["reason_verdicts"] = {code: REASONS[code][1] for code in self.reasons}
        return out

    def headline(self) -> str:
        """``check-tokens: 40 checked (ok 38, warn 0, drift 2, invalid 0), 12 already checked; drift rate 5.00%``."""
        verdicts = ", ".join(f"{name} {n:,}" for name, n in self.verdicts.items())
        return (
            f"check-tokens{' (dry run)' if self.dry_run else ''}: {self.checked:,} checked ({verdicts}), "
            f"{self.skipped_existing:,} already checked; drift rate {self.drift_rate:.2%}"
        )
