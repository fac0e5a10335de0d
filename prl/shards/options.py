"""Options of ``prl build-shards``: the ``[shards]`` table of a recipe, validated with clear messages.

Every option has a default; :meth:`ShardOptions.from_mapping` takes a recipe's ``[shards]`` table (or CLI overrides)
and rejects unknown keys and bad values with a :class:`~prl.errors.UsageError` that names the key. Values are
checked by the same :class:`prl.validation.Validator` the rest of a recipe is (one rule per option,
:data:`_RULES`), also when options are built in code; strings from the command line are parsed.
:meth:`ShardOptions.to_dict` is the canonical JSON form recorded in each manifest and hashed into the shard set id.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from prl.errors import UsageError
from prl.numerics.advantages import METHODS
from prl.numerics.kl import ESTIMATORS, PLACEMENTS
from prl.schema import FINISH_REASONS
from prl.validation import Validator
from prl.verdicts import REASONS

VERSION_RE = r"(\d+)\D*$"
MAX_SET_SAMPLES = 50_000
"""Default :attr:`ShardOptions.max_set_samples`: about 25 M tokens of 500-token samples; a build's peak memory
at the cap is about 400 MB (``bench/bench_shards_memory.py``)."""
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
    """What ``build_shards`` keeps and how it scores it. See docs/design.md and each field's note."""

    rewards: dict[str, float] = field(default_factory=dict)
    """Score = Σ weight · value of these named reward components (latest event per sample and name). Empty: the
    one reward name the rewards table holds (:func:`prl.shards.rewards.resolve_rewards`)."""
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
    """Keep samples whose token-check verdict is ``warn`` (a check could not be completed). ``ok`` and ``note``
    (information about IDs as sampled) are always kept, ``drift`` and ``invalid`` always dropped
    (docs/verdicts.md)."""
    drop_checks: tuple[str, ...] | None = None
    """Check reasons (:data:`prl.verdicts.REASONS`) that drop a sample whatever its verdict, e.g.
    ``["roundtrip_completion"]``. None: ``prefix_fork`` in a build that merges turns, nothing otherwise; ``[]``:
    nothing."""
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
    merge_turns: bool = False
    """Ship consecutive CLEAN (and REALIGN) turns of a trajectory as one row (:mod:`prl.shards.merge`)."""
    merge_reward: str = "last"
    """A merged row's reward from its turns' scores: ``last`` (the last turn's), ``sum`` or ``mean``."""
    max_set_samples: int | None = MAX_SET_SAMPLES
    """Traces rows one set considers at most: a build with more to read publishes several sets in turns
    (:mod:`prl.shards.turns`), so its memory is bounded by this, not by the store; None (``"none"`` in a recipe or
    ``--set``): one set, however many."""

    def __post_init__(self) -> None:
        self._validate(Validator("shards", text=True))

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, where: str | None = None) -> ShardOptions:
        """Options from a recipe's ``[shards]`` table (``where``: the recipe file, for messages); unknown keys
        and bad values raise :class:`UsageError` naming the key."""
        mapping = dict(mapping or {})
        v = Validator("shards", where, text=True)
        v.known(mapping, sorted(f.name for f in fields(cls)))
        try:
            return cls(**mapping)
        except UsageError as exc:
            if where is None:
                raise
            raise UsageError(f"{v.prefix()}{exc}") from None

    def replace(self, **changes: Any) -> ShardOptions:
        """A copy with ``changes`` applied (validated like :meth:`from_mapping`)."""
        merged = {**self.to_dict(), **changes}
        return ShardOptions.from_mapping(merged)

    def to_dict(self) -> dict[str, Any]:
        """Canonical JSON-able form (recorded in manifests, hashed into set ids)."""
        out = asdict(self)
        out["finish_reasons"] = sorted(self.finish_reasons)
        if self.drop_checks is not None:
            out["drop_checks"] = list(self.drop_checks)
        out["rewards"] = dict(sorted(self.rewards.items()))
        return out

    @property
    def dropped_checks(self) -> tuple[str, ...]:
        """The check reasons that drop a sample in this build (:attr:`drop_checks`, or its default)."""
        if self.drop_checks is not None:
            return self.drop_checks
        return ("prefix_fork",) if self.merge_turns else ()

    def digest(self) -> str:
        """sha256 of the canonical JSON form."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    # --- validation ---------------------------------------------------------------------------------------
    def _validate(self, v: Validator) -> None:
        """Check and normalize every field with its rule (:data:`_RULES`), then the rules across fields."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None or f.name not in _OPTIONAL:
                object.__setattr__(self, f.name, _RULES[f.name](v, f.name, value))
        if self.kl in ("reward", "advantages") and self.kl_coef == 0:
            raise v.fail("kl_coef", f"kl = {self.kl!r} needs kl_coef > 0 (or kl = 'column' for the column only)")


def _finish_reasons(v: Validator, key: str, value: Any) -> tuple[str, ...]:
    reasons = tuple(sorted(set(v.names(key, value, FINISH_REASONS))))
    if not reasons:
        raise v.fail(key, "keep at least one finish reason")
    return reasons


def _current_version(v: Validator, key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise v.bad(key, "a version string or integer", value)
    if parse_version(value) is None:
        raise v.fail(key, f"no integer version in {value!r}")
    return str(value)


def _topk(v: Validator, key: str, value: Any) -> int | str:
    if value == "auto":
        return value
    if isinstance(value, str) and not value.strip().isdigit():
        raise v.bad(key, "'auto', an integer ≥ 1 or nothing", value)
    return v.integer(key, value, minimum=1)


def _rewards(v: Validator, key: str, value: Any) -> dict[str, float]:
    if value == {}:
        return {}  # none chosen: the one name the rewards table holds (prl.shards.rewards)
    return dict(sorted(v.weights(key, value).items()))


def _choice(choices: tuple[str, ...]) -> Callable[[Validator, str, Any], str]:
    return lambda v, key, value: v.string(key, value, choices)


def _cap(v: Validator, key: str, value: Any) -> int | None:
    """A count ≥ 1, or ``"none"`` (what a recipe or ``--set`` writes for no cap: TOML has no null) for None."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    return v.integer(key, value, minimum=1)


def _count(minimum: int | None) -> Callable[[Validator, str, Any], int]:
    return lambda v, key, value: v.integer(key, value, minimum)


_RULES: dict[str, Callable[[Validator, str, Any], Any]] = {
    "rewards": _rewards,
    "advantage": _choice(METHODS),
    "singleton_baseline": _choice(("batch", "none", *BASELINE_FIELDS)),
    "drop_constant_groups": Validator.boolean,
    "kl": _choice(PLACEMENTS),
    "kl_estimator": _choice(ESTIMATORS),
    "kl_coef": lambda v, key, value: v.number(key, value, minimum=0.0),
    "ref_model": Validator.string,
    "missing_ref": _choice(("error", "drop")),
    "max_staleness": _count(0),
    "current_version": _current_version,
    "finish_reasons": _finish_reasons,
    "min_completion_tokens": _count(1),
    "max_prompt_tokens": _count(0),
    "max_completion_tokens": _count(0),
    "max_total_tokens": _count(0),
    "allow_warn": Validator.boolean,
    "drop_checks": lambda v, key, value: tuple(sorted(set(v.names(key, value, REASONS)))),
    "require_checks": Validator.boolean,
    "tokenizer_fingerprint": Validator.string,
    "topk": _topk,
    "target_tokens": _count(1),
    "seed": _count(0),
    "max_drop_rate": Validator.rate,
    "merge_turns": Validator.boolean,
    "merge_reward": _choice(("last", "sum", "mean")),  # prl.shards.merge.REWARD_MODES
    "max_set_samples": lambda v, key, value: _cap(v, key, value),
}
"""One check per option: ``rule(validator, key, value) -> normalized value`` (raises :class:`UsageError`)."""

_OPTIONAL = {
    "ref_model",
    "max_staleness",
    "current_version",
    "max_prompt_tokens",
    "max_completion_tokens",
    "max_total_tokens",
    "tokenizer_fingerprint",
    "drop_checks",
    "topk",
    "max_drop_rate",
    "max_set_samples",
}
"""Options whose value may be None (nothing set)."""
