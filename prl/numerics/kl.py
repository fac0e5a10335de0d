"""Sampled KL against a reference policy, per completion token (docs/design.md), over flat arrays.

Token arrays of a batch are flat (``_T``: all completion tokens of all samples, concatenated) with
``offsets_N1`` (int64, length N + 1, ``offsets_N1[0] == 0``) marking where each sample's tokens begin and end,
as Arrow list arrays store them. ``valid_T`` marks tokens that take part: in the loss mask, with finite
behaviour and reference logprobs (a null logprob never counts as 0.0).

With ``d_t = log q(t) − log p_ref(t)`` (q: the sampling policy, p_ref: the reference):

- ``k1 = d``
- ``k2 = ½ d²``
- ``k3 = eˣ − x − 1`` with ``x = clamp(−d, −20, 20)``, then clamped to ≤ 10 (verl ``kl_penalty_forward``
  "low_var_kl", NeMo RL ``calculate_kl``)

Placements:

- ``advantages``: ``A_t = A + β·(mean_batch(d) − d_t)`` on valid tokens, the mean taken over all valid tokens
  of the batch (tinker-cookbook ``incorporate_kl_penalty``)
- ``reward``: ``r − β·Σ_t k(d_t)`` over the sample's valid tokens (verl ``apply_kl_penalty``, summed)
- ``column``: only the per-token ``k(d_t)`` column for the trainer
"""

from __future__ import annotations

import numpy as np

ESTIMATORS = ("k1", "k2", "k3")
PLACEMENTS = ("none", "column", "reward", "advantages")
K3_CLAMP_X = 20.0
K3_MAX = 10.0


def log_ratio(logprobs_T: np.ndarray, ref_logprobs_T: np.ndarray) -> np.ndarray:
    """``d_T = log q − log p_ref`` in float64 (NaN where either side is NaN); float32 inputs are widened on the
    fly (one new array, no widened copies)."""
    return np.subtract(logprobs_T, ref_logprobs_T, dtype=np.float64)


def kl_estimate(d_T: np.ndarray, estimator: str = "k3") -> np.ndarray:
    """Per-token KL estimate ``k(d_T)`` (float64, a new array) for ``estimator`` in ``k1``, ``k2``, ``k3``.

    k3 is computed in one buffer: with ``x = clamp(−d, −20, 20)``, ``eˣ − 1 − x`` equals ``expm1(x) + d``
    wherever the clamp does not bite (``x = −d`` exactly, so the rounding is the same), and every ``d`` outside
    ``[−20, 20]`` gives the cap of 10.
    """
    d_T = np.asarray(d_T, dtype=np.float64)
    if estimator == "k1":
        return d_T.copy()
    if estimator == "k2":
        return 0.5 * d_T * d_T
    if estimator == "k3":
        k_T = np.negative(d_T)
        np.clip(k_T, -K3_CLAMP_X, K3_CLAMP_X, out=k_T)
        np.expm1(k_T, out=k_T)
        k_T += d_T
        np.minimum(k_T, K3_MAX, out=k_T)  # d > 20: expm1(−20) + d > 10
        if d_T.size and np.fmin.reduce(d_T) < -K3_CLAMP_X:  # d < −20 (also −inf; NaN skipped): x = 20, above the cap
            k_T[d_T < -K3_CLAMP_X] = K3_MAX
        return k_T
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}")


def segment_sum(values_T: np.ndarray, offsets_N1: np.ndarray) -> np.ndarray:
    """``Σ`` of ``values_T`` within each sample: ``sums_N`` float64 (0 for empty samples).

    Each sample is summed on its own (``np.add.reduceat``), so a sum depends only on that sample's values, never
    on where the sample sits in the batch.
    """
    offsets_N1 = np.asarray(offsets_N1, dtype=np.int64)
    values_T = np.asarray(values_T, dtype=np.float64)
    starts_N = offsets_N1[:-1]
    sums_N = np.zeros(len(starts_N))
    nonempty_N = offsets_N1[1:] > starts_N
    if nonempty_N.all() and len(starts_N):
        return np.add.reduceat(values_T[: offsets_N1[-1]], starts_N)
    if nonempty_N.any():  # an empty segment's start equals the next start, so reduceat over the others is exact
        sums_N[nonempty_N] = np.add.reduceat(values_T[: offsets_N1[-1]], starts_N[nonempty_N])
    return sums_N


def log_ratio_sums(
    logprobs_T: np.ndarray, ref_logprobs_T: np.ndarray, valid_T: np.ndarray, offsets_N1: np.ndarray
) -> np.ndarray:
    """``Σ_t d_t`` per sample over its valid tokens (float64), as ``Σ log q − Σ log p_ref``: each side summed on
    its own (:func:`segment_sum`), so that a side can be summed where it is read, without the other.

    A sample whose tokens are all valid gets exactly ``segment_sum(logprobs) − segment_sum(ref_logprobs)``,
    however its tokens were gathered.
    """
    valid_T = np.asarray(valid_T, dtype=bool)
    lp_T = np.where(valid_T, logprobs_T, 0.0)
    ref_T = np.where(valid_T, ref_logprobs_T, 0.0)
    return segment_sum(lp_T, offsets_N1) - segment_sum(ref_T, offsets_N1)


def broadcast(values_N: np.ndarray, offsets_N1: np.ndarray) -> np.ndarray:
    """Repeat each sample's value over its tokens: ``values_T``."""
    return np.repeat(np.asarray(values_N), np.diff(np.asarray(offsets_N1, dtype=np.int64)))  # type: ignore[arg-type]


def masked_log_ratio(
    logprobs_T: np.ndarray, ref_logprobs_T: np.ndarray, mask_T: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(d_T, valid_T)``: the log ratio (float64), 0.0 where a token is not valid.

    A token is valid when it is inside the loss mask and ``d`` is finite: both logprobs are finite (one
    subtraction and one test instead of a test per side; two finite logprobs, ≤ 0, never overflow).
    """
    d_T = log_ratio(logprobs_T, ref_logprobs_T)
    valid_T = np.isfinite(d_T)
    if mask_T is not None:
        valid_T &= np.asarray(mask_T, dtype=bool)
    if not valid_T.all():
        d_T[~valid_T] = 0.0
    return d_T, valid_T


def masked_kl(
    logprobs_T: np.ndarray,
    ref_logprobs_T: np.ndarray,
    mask_T: np.ndarray | None,
    estimator: str = "k3",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(d_T, kl_T, valid_T)``: the log ratio and KL estimate, both 0.0 where a token is not valid."""
    d_T, valid_T = masked_log_ratio(logprobs_T, ref_logprobs_T, mask_T)
    return d_T, kl_estimate(d_T, estimator), valid_T  # every estimator is +0.0 where d is 0.0


def valid_counts(valid_T: np.ndarray, offsets_N1: np.ndarray) -> np.ndarray:
    """Number of valid tokens per sample: ``count_N`` (int64)."""
    offsets_N1 = np.asarray(offsets_N1, dtype=np.int64)
    lengths_N = np.diff(offsets_N1)
    if valid_T.all():
        return lengths_N
    counts_N = np.zeros(len(lengths_N), dtype=np.int64)
    nonempty_N = lengths_N > 0
    if nonempty_N.any():
        counts_N[nonempty_N] = np.add.reduceat(valid_T, offsets_N1[:-1][nonempty_N], dtype=np.int64)
    return counts_N


def kl_into_reward(rewards_N: np.ndarray, kl_sum_N: np.ndarray, beta: float) -> np.ndarray:
    """``rewards_N − β·Σ_t kl_t`` (float64), with ``kl_sum_N`` each sample's KL summed over its valid tokens
    (:func:`segment_sum` of the ``kl_T`` that :func:`masked_kl` returns, 0 on invalid tokens)."""
    return np.asarray(rewards_N, dtype=np.float64) - beta * np.asarray(kl_sum_N, dtype=np.float64)


def batch_mean_log_ratio(d_sum_N: np.ndarray, count_N: np.ndarray) -> float:
    """``mean_batch(d)`` over the valid tokens of a batch, from each sample's ``Σ_t d_t`` (:func:`log_ratio_sums`)
    and valid-token count (:func:`valid_counts`); 0.0 when no token is valid. The sums are added in sample order,
    so the mean does not depend on how the samples were gathered."""
    count = int(np.sum(count_N, dtype=np.int64))
    return float(np.sum(d_sum_N, dtype=np.float64) / count) if count else 0.0


def kl_into_token_advantages(
    token_advantages_T: np.ndarray,
    d_T: np.ndarray,
    valid_T: np.ndarray,
    beta: float,
    mean_d: float,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``A_t + β·(mean_d − d_t)`` on valid tokens, ``A_t`` elsewhere (float64).

    Written into ``out`` when given (a float64 array of the same length; it may be ``d_T`` itself), else into a
    new array.
    """
    penalty_T = np.subtract(mean_d, d_T, dtype=np.float64, out=out)
    penalty_T *= beta
    if not valid_T.all():
        penalty_T[~valid_T] = 0.0
    penalty_T += token_advantages_T
    return penalty_T
