"""Thresholds of the token checks. They are part of the tokenizer fingerprint: changing one re-checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckOptions:
    """Thresholds; units in the field docs."""

    realign_window: int = 4
    """Tokens at the end of the previous completion inside which a prefix divergence is REALIGN, not FORK."""
    positive_atol: float = 1e-5
    """A logprob above this (nats) is positive, hence invalid."""
    placeholder_min_tokens: int = 4
    """A completion needs at least this many scored tokens before the exact-0.0 placeholder test applies."""
    placeholder_fraction: float = 0.5
    """Exact 0.0 on at least this fraction of scored tokens is a placeholder signature."""
    placeholder_run: int = 16
    """…or a run of at least this many consecutive exact 0.0 logprobs."""
    low_logprob: float = -15.0
    """A sampled token below this logprob (nats) is almost never sampled: p < 3e-7."""
    low_logprob_min_count: int = 3
    low_logprob_fraction: float = 0.05
    """At least ``low_logprob_min_count`` tokens and this fraction of scored tokens below ``low_logprob`` is
    the signature of retokenized data."""
    head_atol: float = 1e-4
    """Sampled logprob vs the same token's head logprob (nats)."""
    head_mass_atol: float = 1e-5
    """Σ exp(head logprobs) may exceed 1 by this much."""
    degenerate_atol: float = 1e-3
    """Uniform −log V tolerance for a degenerate head (nats)."""
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    """Extra stop tokens next to EOS and the known end-of-turn tokens."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop_token_ids"] = sorted(self.stop_token_ids)
        return d
