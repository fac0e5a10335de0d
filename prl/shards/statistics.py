"""Summaries a build reports and records in its manifest: counts, drops, per-sample distributions, heads and
sampling settings, KL (docs/design.md). Every summary is computed from the plan and the scores, never from the
clock, so a rebuild writes the same manifest."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from prl.numerics import heads
from prl.numerics.kl import K3_MAX
from prl.shards.options import ShardOptions
from prl.shards.plan import Plan
from prl.shards.publish import json_safe
from prl.shards.scores import Scores


def summary(values: np.ndarray) -> dict[str, float | int | None]:
    """count, mean, std, min, p50, p95, max of the finite ``values`` (None when there are none)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return {"count": 0, "mean": None, "std": None, "min": None, "p50": None, "p95": None, "max": None}
    p50, p95 = np.quantile(values, [0.5, 0.95])
    return {
        "count": len(values),
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "p50": float(p50),
        "p95": float(p95),
        "max": float(values.max()),
    }


SAMPLING_SETTINGS = ("temperature", "top_p", "top_k", "logprobs_mode")


def sampling_summary(ship: pl.DataFrame) -> dict[str, Any]:
    """The manifest's ``sampling``: for each sampling setting, the rows per known value (values ascending) and
    the rows where the trace did not record it; for the policy, the step range, the distinct versions and the
    rows with per-token version spans. A setting that is not finite (ingest refuses those; a store written
    otherwise may hold them) is named ``"inf"``, ``"-inf"`` or ``"nan"``."""
    out: dict[str, Any] = {}
    for name in SAMPLING_SETTINGS:
        counts = ship.group_by(name).len().drop_nulls(name).sort(name)
        out[name] = {
            "values": [
                {"value": json_safe(float(v)) if isinstance(v, float) else v, "rows": int(n)}
                for v, n in zip(counts[name].to_list(), counts["len"].to_list(), strict=True)
            ],
            "unknown": int(ship[name].null_count()),
        }
    steps = ship["policy_step"].drop_nulls()
    out["policy"] = {
        "versions": int(ship["policy_version"].drop_nulls().n_unique()),
        "unknown_version": int(ship["policy_version"].null_count()),
        "min_step": int(steps.min()) if len(steps) else None,  # type: ignore[arg-type]
        "max_step": int(steps.max()) if len(steps) else None,  # type: ignore[arg-type]
        "rows_with_spans": int(ship["policy_version_spans"].list.len().fill_null(0).gt(0).sum()),
    }
    return out


def heads_info(ship: pl.DataFrame, k: int | None) -> dict[str, Any]:
    """The manifest's ``heads``: k, padding, and the sampling settings of the shipped samples
    (:func:`sampling_summary`, which score centering needs beside the heads)."""
    return {
        "k": k,
        "pad_id": heads.PAD_ID,
        "pad_logprob": "-inf",
        "convention": "first k entries per position (sorted descending); rows narrower than k never ship",
        "sampling": {name: sampling_summary(ship)[name] for name in SAMPLING_SETTINGS},
    }


def build_statistics(plan: Plan, scores: Scores | None, options: ShardOptions) -> dict[str, Any]:
    """The manifest's and the result's ``statistics`` (``scores`` None: nothing ships, or a dry run without them)."""
    ship = plan.ship
    stats: dict[str, Any] = {
        "considered": plan.considered,
        "already_shipped": plan.already_shipped,
        "shipped": ship.height,
        "dropped": sum(plan.drops.values()),
        "drops": plan.drops,
        "reward_names_seen": plan.reward_names_seen,
        "constant_groups_dropped": 0,
    }
    if ship.height:
        stats["prompt_len"] = summary(ship["prompt_len"].to_numpy())
        stats["completion_len"] = summary(ship["completion_len"].to_numpy())
        stats["staleness"] = summary(ship["staleness"].to_numpy().astype(np.float64))
        stats["score"] = summary(ship["score"].to_numpy())
    if scores is not None:
        stats["reward"] = summary(scores.reward_N)
        stats["advantage"] = summary(scores.advantage_N)
        stats["group_size"] = summary(scores.group_size_N)
        stats["groups_of_one"] = scores.singleton_groups
        stats["groups_of_one_fell_back"] = scores.singleton_groups - scores.singletons_without_baseline
        stats["groups_of_one_without_baseline"] = scores.singletons_without_baseline
        stats["singleton_baseline"] = options.singleton_baseline
    if options.drop_constant_groups and "constant_group" in plan.drops:
        stats["constant_samples_dropped"] = plan.drops["constant_group"]
        stats["constant_groups_dropped"] = plan.constant_groups
    return stats


def kl_statistics(
    options: ShardOptions, mean_d: float, kl_tok_sum: float, kl_tok_n: int, kl_capped: int = 0
) -> dict[str, Any]:
    """The ``kl`` entry of a build's statistics: estimator, placement, β, mean per-token KL of the shipped valid
    tokens, the batch mean log ratio (with ``kl`` in ``reward`` / ``advantages``) and, with k3, how many of the
    tokens sit at its cap of 10 (``at_cap``; None for the other estimators). Many tokens there mean the reference
    and the sampling policy disagree far beyond what k3 measures: the penalty no longer grows with the gap."""
    return {
        "estimator": options.kl_estimator,
        "placement": options.kl,
        "coef": options.kl_coef,
        "mean_per_token": kl_tok_sum / kl_tok_n if kl_tok_n else None,
        "tokens": kl_tok_n,
        "mean_log_ratio": mean_d if options.kl in ("reward", "advantages") else None,
        "at_cap": kl_capped if options.kl_estimator == "k3" else None,
    }


KL_CAP_WARN = 0.10
"""Fraction of KL tokens at the k3 cap above which a build warns (:func:`kl_cap_warning`)."""


def kl_cap_warning(kl: dict[str, Any] | None) -> str | None:
    """The warning for a build's ``kl`` statistics when more than :data:`KL_CAP_WARN` of its KL tokens sit at the k3
    cap; None otherwise."""
    if not kl or not kl.get("tokens") or not kl.get("at_cap"):
        return None
    share = kl["at_cap"] / kl["tokens"]
    if share <= KL_CAP_WARN:
        return None
    return (
        f"{kl['at_cap']:,} of {kl['tokens']:,} KL tokens ({share:.0%}) sit at the k3 cap of {K3_MAX:g}: there the "
        "penalty no longer grows with the gap between the sampling policy and the reference (is ref_model the "
        "policy's reference model?)"
    )


__all__ = ["KL_CAP_WARN", "build_statistics", "heads_info", "kl_cap_warning", "kl_statistics", "summary"]
