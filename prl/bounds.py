"""The default and the range of every numeric option, declared once: read by the options models of
:mod:`prl.options`, hence by the command line (its defaults and its options' ``min``/``max``, so a value outside is
a usage error before anything runs) and by recipes, and by the library calls.

Each upper bound is far above any sensible setting and far below what the libraries underneath accept: delta-rs
panics on a retention whose hours do not fit a ``TimeDelta`` (about 2.6 · 10¹² hours) and refuses a target size
past ``i64::MAX`` bytes; a retry count in the thousands overflows the backoff's ``2^attempt``.
"""

from __future__ import annotations

import math

from prl.errors import UsageError

MAX_QUARANTINE_RATE = 0.05
"""``--max-quarantine-rate`` (ingest, side tables, score-ref): exit 1 above this fraction quarantined."""
BATCH_TOKENS = 16384
"""``score-ref --batch-tokens``: tokens per committed batch (a local model: padded tokens per forward pass)."""
CONCURRENCY = 8
"""``score-ref --concurrency``: endpoint requests in flight."""
RETRIES = 5
"""``score-ref --retries``: retries per request on 429 / 5xx / timeouts."""
TIMEOUT_S = 120.0
"""``score-ref --timeout``: seconds per endpoint request."""
RETENTION_HOURS = 168
"""``prl maintain --retention-hours``: Delta's own default (a reader may stay pinned at a version for a week)."""
TARGET_MB = 128
"""``prl maintain --target-mb``: the size of compacted data files."""

MIN_RETENTION_HOURS = 1
MAX_RETENTION_HOURS = 100 * 365 * 24
"""``prl maintain --retention-hours``: at most a hundred years."""
MIN_TARGET_MB = 1
MAX_TARGET_MB = 1 << 20
"""``prl maintain --target-mb``: at most 1 TiB per compacted file."""
MAX_BATCH_TOKENS = 1 << 30
"""``score-ref --batch-tokens``."""
MAX_CONCURRENCY = 4096
"""``score-ref --concurrency``: requests in flight (each one a thread)."""
MAX_RETRIES = 100
"""``score-ref --retries``."""
MAX_TIMEOUT_S = 86_400.0
"""``score-ref --timeout``: a day per request."""
TEMPLATE_TIMEOUTS = 3
"""``check-tokens --max-template-timeouts``'s default: conversations of a run whose chat template may run past its
render time budget before the rest get ``template_budget`` unrendered (:mod:`prl.checks.template_worker`, which
imports nothing of prl, holds the same number as its own default)."""
MAX_TEMPLATE_TIMEOUTS_LIMIT = 1_000_000
"""``check-tokens --max-template-timeouts``."""


def check_int(option: str, value: object, minimum: int, maximum: int) -> int:
    """``value`` when it is an integer (not a bool) in ``[minimum, maximum]``; else :class:`UsageError` naming
    ``option`` and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise UsageError(f"{option} must be an integer in [{minimum}, {maximum}], not {value!r}")
    return value


def check_seconds(option: str, value: object, maximum: float = MAX_TIMEOUT_S) -> float:
    """``value`` when it is a finite number of seconds in ``(0, maximum]`` (NaN and infinities refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{option} must be a number of seconds in (0, {maximum:g}], not {value!r}")
    if not 0 < value <= maximum:
        raise UsageError(f"{option} must be a number of seconds in (0, {maximum:g}], not {value!r}")
    return float(value)
