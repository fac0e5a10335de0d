"""Options of ``prl build-shards``: the ``[shards]`` table of a recipe, validated with clear messages.

Every option has a default; :meth:`ShardOptions.from_mapping` takes a recipe's ``[shards]`` table (or CLI overrides)
and rejects unknown keys and bad values with a :class:`~prl.errors.UsageError` that names the key.
:meth:`ShardOptions.to_dict` is the canonical JSON form recorded in each manifest and hashed into the shard set id.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from prl.errors import UsageError
from prl.numerics.advantages import METHODS
from prl.numerics.kl import ESTIMATORS, PLACEMENTS
from prl.schema import FINISH_REASONS

VERSION_RE = r"(\d+)\D*$"
"""The integer a policy version string ends with (``"step-120"`` → 120), as polars and :mod:`re` read it."""


def parse_version(version: str | int | None) -> int | None:
    """The integer in a policy version string: ``"step-120"`` → 120, ``"120"`` → 120, none → None."""
    if version is None:
        return None
    match = re.search(VERSION_RE, str(version))
    return int(match.group(1)) if match else None


BASELINE_FIELDS = ("request_id", "session_id", "model", "policy_version", "source_uri", "source_format")
"""Trace columns a singleton group may take its baseline from (besides ``batch`` and ``none``)."""


@dataclass(frozen=True)
class ShardOptions:
    """What ``build_shards`` keeps and how it scores it. See design.md §5–6 and each field's note."""

    rewards: dict[str, float] = field(default_factory=lambda: {"reward": 1.0})
    """Score = Σ weight · value of these named reward components (latest event per sample and name)."""
    advantage: str = "mean"
    """``mean`` (r − group mean), ``loo`` (leave-one-out) or ``std`` (divide by unbiased σ + 1e-6)."""
    singleton_baseline: str = "batch"
    """Baseline for groups of one: ``batch`` (all shipped samples), ``none`` (advantage 0), or a trace column."""
    drop_constant_groups: bool = False
    """Drop groups (size ≥ 2) whose scores, before any KL penalty, are all equal."""
    kl: str = "none"
    """Where sampled KL goes: ``none``, ``column`` (kl column only), ``reward`` or ``advantages``."""
    kl_estimator: str = "k3"
    kl_coef: float = 0.0
    """β of the KL penalty."""
    ref_model: str | None = None
    """Use reference logprobs of this model only (default: the latest ingested per sample)."""
    missing_ref: str = "error"
    """With KL on, a sample without reference logprobs is an ``error`` (exit 2) or is dropped (``drop``)."""
    max_staleness: int | None = None
    """Drop samples with ``current_version − policy_version`` above this (and those of unknown version)."""
    current_version: str | None = None
    """The trainer's current policy version ("step-120" or "120"); default: the newest version in the traces."""
    finish_reasons: tuple[str, ...] = ("stop", "length", "tool_calls")
    min_completion_tokens: int = 1
    max_prompt_tokens: int | None = None
    max_completion_tokens: int | None = None
    max_total_tokens: int | None = None
    allow_warn: bool = False
    """Keep samples whose token-check verdict is ``warn`` (``ok`` is always kept)."""
    require_checks: bool = True
    """Drop samples without a token-check verdict."""
    tokenizer_fingerprint: str | None = None
    """Use verdicts of this tokenizer only (default: the latest verdict per sample)."""
    topk: int | str | None = None
    """Sampler heads in shards: None (no heads), ``auto`` (k = narrowest head shipped) or a fixed k."""
    target_tokens: int = 4_000_000
    """Prompt + completion tokens per shard (a group larger than this gets a shard of its own)."""
    seed: int = 0
    """Seed of the group shuffle."""
    max_drop_rate: float | None = None
    """Exit 1 when more than this fraction of considered samples was dropped."""

    def __post_init__(self) -> None:
        self._validate()

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> ShardOptions:
        """Options from a recipe's ``[shards]`` table; unknown keys and bad values raise :class:`UsageError`."""
        mapping = dict(mapping or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise UsageError(
                f"unknown [shards] option(s): {', '.join(unknown)}; known options: {', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        for key, value in mapping.items():
            values[key] = _coerce(key, value)
        return cls(**values)

    def replace(self, **changes: Any) -> ShardOptions:
        """A copy with ``changes`` applied (validated like :meth:`from_mapping`)."""
        merged = {**self.to_dict(), **changes}
        return ShardOptions.from_mapping(merged)

    def to_dict(self) -> dict[str, Any]:
        """Canonical JSON-able form (recorded in manifests, hashed into set ids)."""
        out = asdict(self)
        out["finish_reasons"] = sorted(self.finish_reasons)
        out["rewards"] = dict(sorted(self.rewards.items()))
        return out

    def digest(self) -> str:
        """sha256 of the canonical JSON form."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    # --- validation ---------------------------------------------------------------------------------------
    def _validate(self) -> None:
        object.__setattr__(self, "finish_reasons", tuple(sorted(set(self.finish_reasons))))
        object.__setattr__(self, "rewards", dict(sorted(self.rewards.items())))

        def bad(key: str, message: str) -> UsageError:
            return UsageError(f"[shards] {key}: {message}")

        if not self.rewards:
            raise bad("rewards", "name at least one reward component")
        for name, weight in self.rewards.items():
            if not isinstance(name, str) or not name:
                raise bad("rewards", f"component names must be non-empty strings, got {name!r}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise bad("rewards", f"weight of {name!r} must be a finite number, got {weight!r}")
        _choice("advantage", self.advantage, METHODS)
        if self.singleton_baseline not in ("batch", "none", *BASELINE_FIELDS):
            raise bad(
                "singleton_baseline",
                f"expected batch, none or one of {', '.join(BASELINE_FIELDS)}; got {self.singleton_baseline!r}",
            )
        _choice("kl", self.kl, PLACEMENTS)
        _choice("kl_estimator", self.kl_estimator, ESTIMATORS)
        _choice("missing_ref", self.missing_ref, ("error", "drop"))
        if not math.isfinite(self.kl_coef) or self.kl_coef < 0:
            raise bad("kl_coef", f"must be a finite number ≥ 0, got {self.kl_coef!r}")
        if self.kl in ("reward", "advantages") and self.kl_coef == 0:
            raise bad("kl_coef", f"kl = {self.kl!r} needs kl_coef > 0 (or kl = 'column' for the column only)")
        for reason in self.finish_reasons:
            _choice("finish_reasons", reason, FINISH_REASONS)
        if not self.finish_reasons:
            raise bad("finish_reasons", "keep at least one finish reason")
        for key in ("max_staleness", "max_prompt_tokens", "max_completion_tokens", "max_total_tokens"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise bad(key, f"must be ≥ 0, got {value}")
        if self.min_completion_tokens < 1:
            raise bad("min_completion_tokens", f"must be ≥ 1, got {self.min_completion_tokens}")
        if self.current_version is not None:
            if parse_version(self.current_version) is None:
                raise bad("current_version", f"no integer version in {self.current_version!r}")
        if self.topk is not None and self.topk != "auto" and (isinstance(self.topk, str) or self.topk < 1):
            raise bad("topk", f"expected 'auto', an integer ≥ 1 or nothing; got {self.topk!r}")
        if self.target_tokens < 1:
            raise bad("target_tokens", f"must be ≥ 1, got {self.target_tokens}")
        if self.max_drop_rate is not None and not 0.0 <= self.max_drop_rate <= 1.0:
            raise bad("max_drop_rate", f"must be within [0, 1], got {self.max_drop_rate}")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"[shards] {key}: expected one of {', '.join(choices)}; got {value!r}")


_INT_KEYS = {
    "max_staleness",
    "min_completion_tokens",
    "max_prompt_tokens",
    "max_completion_tokens",
    "max_total_tokens",
    "target_tokens",
    "seed",
}
_BOOL_KEYS = {"drop_constant_groups", "allow_warn", "require_checks"}
_STR_KEYS = {"advantage", "singleton_baseline", "kl", "kl_estimator", "missing_ref"}
_OPT_STR_KEYS = {"ref_model", "tokenizer_fingerprint"}


def _coerce(key: str, value: Any) -> Any:
    """Type-check one option value from TOML/JSON/CLI (strings from the CLI are parsed)."""

    def bad(expected: str) -> UsageError:
        return UsageError(f"[shards] {key}: expected {expected}, got {value!r}")

    if key in _INT_KEYS:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        if value is None and key.startswith("max_"):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if key in _BOOL_KEYS:
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if key in _STR_KEYS:
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if key in _OPT_STR_KEYS:
        if value is not None and (not isinstance(value, str) or not value):
            raise bad("a non-empty string")
        return value
    if key == "current_version":
        if isinstance(value, bool) or not isinstance(value, (str, int, type(None))):
            raise bad("a version string or integer")
        return None if value is None else str(value)
    if key == "kl_coef":
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad("a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if key == "max_drop_rate":
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad("a number in [0, 1]") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number in [0, 1]")
        return float(value)
    if key == "rewards":
        if isinstance(value, str) and "=" in value:  # command line: "correct=1,format=0.2"
            pairs = [part.partition("=") for part in value.split(",") if part.strip()]
            try:
                return {name.strip(): float(weight) for name, _, weight in pairs}
            except ValueError:
                raise bad("NAME=WEIGHT pairs separated by commas") from None
        if isinstance(value, str):
            return {value.strip(): 1.0}
        if isinstance(value, Mapping):
            return {str(k): v for k, v in value.items()}
        raise bad("a reward name or a table of name = weight")
    if key == "finish_reasons":
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise bad("a list of finish reasons")
        return tuple(value)
    if key == "topk":
        if value is None or value == "auto":
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("'auto' or an integer ≥ 1")
        return value
    raise bad("a known option")  # pragma: no cover - from_mapping filters unknown keys
