"""Sampled KL estimators and placements against plain-loop values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.numerics import kl


def k3_loop(d: float) -> float:
    x = min(max(-d, -20.0), 20.0)
    return min(math.exp(x) - x - 1.0, 10.0)


def test_estimators_exact():
    d = np.array([0.0, 0.5, -1.0, 30.0, -30.0])
    np.testing.assert_allclose(kl.kl_estimate(d, "k1"), d)
    np.testing.assert_allclose(kl.kl_estimate(d, "k2"), 0.5 * d * d)
    np.testing.assert_allclose(kl.kl_estimate(d, "k3"), [k3_loop(v) for v in d], rtol=1e-12)
    # clamps: d = 30 → x = -20 → e^-20 + 19 → capped at 10; d = -30 → x = 20 → capped at 10
    assert kl.kl_estimate(np.array([30.0, -30.0]), "k3").tolist() == [10.0, 10.0]


def test_unknown_estimator():
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl.kl_estimate(np.zeros(1), "k4")


def test_masked_kl_excludes_masked_and_missing_tokens():
    lp = np.array([-1.0, -2.0, np.nan, -0.5])
    ref = np.array([-1.5, -2.0, -1.0, -0.7])
    mask = np.array([True, True, True, False])
    d, k, valid = kl.masked_kl(lp, ref, mask, "k1")
    assert valid.tolist() == [True, True, False, False]
    np.testing.assert_allclose(d, [0.5, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(k, [0.5, 0.0, 0.0, 0.0])


def test_reward_placement():
    k_T = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    off = np.array([0, 2, 2, 5])
    out = kl.kl_into_reward(np.array([1.0, 2.0, 3.0]), kl.segment_sum(k_T, off), beta=0.5)
    np.testing.assert_allclose(out, [1.0 - 0.5 * 0.3, 2.0, 3.0 - 0.5 * 1.2])


def test_advantage_placement_tinker_style():
    d = np.array([0.2, -0.2, 0.6, 0.0])
    valid = np.array([True, True, True, False])
    off = np.array([0, 2, 4])
    mean_d = kl.batch_mean_log_ratio(kl.segment_sum(d, off), kl.valid_counts(valid, off))
    assert mean_d == pytest.approx(0.2)
    out = kl.kl_into_token_advantages(np.array([1.0, 1.0, -1.0, 0.0]), d, valid, 0.1, mean_d)
    np.testing.assert_allclose(out, [1.0, 1.0 + 0.1 * 0.4, -1.0 - 0.1 * 0.4, 0.0])


def test_empty_batch():
    off = np.array([0])
    assert kl.segment_sum(np.array([]), off).shape == (0,)
    assert kl.batch_mean_log_ratio(np.array([]), np.array([], dtype=np.int64)) == 0.0
    assert kl.valid_counts(np.array([], dtype=bool), off).shape == (0,)
    assert kl.broadcast(np.array([]), off).shape == (0,)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.floats(-30, 0, allow_nan=False), st.floats(-30, 0, allow_nan=False), st.booleans()),
            max_size=6,
        ),
        max_size=6,
    ),
    st.sampled_from(["k1", "k2", "k3"]),
    st.floats(0, 2),
)
def test_matches_loop_reference(samples, estimator, beta):
    lp = np.array([t[0] for s in samples for t in s])
    ref = np.array([t[1] for s in samples for t in s])
    mask = np.array([t[2] for s in samples for t in s], dtype=bool)
    off = np.concatenate(([0], np.cumsum([len(s) for s in samples]))).astype(np.int64)
    d, k, valid = kl.masked_kl(lp, ref, mask, estimator)
    rewards = np.arange(len(samples), dtype=np.float64)
    new_r = kl.kl_into_reward(rewards, kl.segment_sum(k, off), beta)
    fn = {"k1": lambda x: x, "k2": lambda x: 0.5 * x * x, "k3": k3_loop}[estimator]
    total_d, count = 0.0, 0
    for i, s in enumerate(samples):
        acc = 0.0
        for a, b, m in s:
            if m:
                acc += fn(a - b)
                total_d += a - b
                count += 1
        assert new_r[i] == pytest.approx(rewards[i] - beta * acc, rel=1e-9, abs=1e-9)
    counts = kl.valid_counts(valid, off)
    assert counts.tolist() == [sum(1 for *_, m in s if m) for s in samples]
    mean_d = kl.batch_mean_log_ratio(kl.log_ratio_sums(lp, ref, valid, off), counts)
    assert mean_d == pytest.approx(total_d / count if count else 0.0, rel=1e-9, abs=1e-12)
    adv_T = kl.kl_into_token_advantages(np.zeros(len(lp)), d, valid, beta, mean_d)
    expected = [beta * (mean_d - (a - b)) if m else 0.0 for s in samples for a, b, m in s]
    np.testing.assert_allclose(adv_T, expected, rtol=1e-9, atol=1e-9)


def k3_textbook(d: np.ndarray) -> np.ndarray:
    """``eˣ − 1 − x`` with ``x = clamp(−d, −20, 20)``, capped at 10, written out the plain way."""
    x = np.clip(-d, -20.0, 20.0)
    return np.minimum(np.expm1(x) - x, 10.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False), max_size=40))
def test_k3_one_buffer_equals_textbook_bit_for_bit(values):
    d = np.array(values, dtype=np.float64)
    got = kl.kl_estimate(d, "k3")
    assert got.tobytes() == k3_textbook(d).tobytes()


def test_k3_with_nan_and_extremes_together():
    d = np.array([np.nan, -np.inf, 0.5, -1e30, np.nan, 25.0])
    got = kl.kl_estimate(d, "k3")
    np.testing.assert_array_equal(got, k3_textbook(d))  # NaN stays NaN, the extremes still hit the cap
    assert got[[1, 3, 5]].tolist() == [10.0, 10.0, 10.0] and np.isnan(got[[0, 4]]).all()


def test_k3_extremes():
    d = np.array([-np.inf, -1e300, -4.9e8, -20.5, -20.0, 20.0, 20.5, 1e300, np.inf, -0.0, 0.0])
    np.testing.assert_array_equal(kl.kl_estimate(d, "k3"), k3_textbook(d))
    assert kl.kl_estimate(d, "k3")[[0, 1, 2, 3, 7, 8]].tolist() == [10.0] * 6


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(-50, 50), max_size=8), max_size=8), st.lists(st.floats(-50, 50), max_size=8))
def test_segment_sum_depends_only_on_the_sample(samples, other):
    def sums(rows):
        values = np.array([v for r in rows for v in r], dtype=np.float64)
        off = np.concatenate(([0], np.cumsum([len(r) for r in rows]))).astype(np.int64)
        return kl.segment_sum(values, off)

    alone = sums(samples)
    with_neighbours = sums([other, *samples, other])[1:-1]
    assert alone.tobytes() == with_neighbours.tobytes()
    for got, row in zip(alone, samples, strict=True):
        assert got == pytest.approx(math.fsum(row), abs=1e-9)


finite_or_nan = st.one_of(st.floats(-30, 0, width=32), st.just(float("nan")))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(finite_or_nan, finite_or_nan, st.booleans()), max_size=8), max_size=8))
def test_log_ratio_sums_add_each_side_over_valid_tokens(samples):
    lp = np.array([a for s in samples for a, _, _ in s], dtype=np.float32)
    ref = np.array([b for s in samples for _, b, _ in s], dtype=np.float32)
    mask = np.array([m for s in samples for _, _, m in s], dtype=bool)
    off = np.concatenate(([0], np.cumsum([len(s) for s in samples]))).astype(np.int64)
    _, valid = kl.masked_log_ratio(lp, ref, mask)
    got = kl.log_ratio_sums(lp, ref, valid, off)
    for i, s in enumerate(samples):
        kept = [(float(np.float32(a)), float(np.float32(b))) for a, b, m in s if m and a == a and b == b]
        assert got[i] == pytest.approx(math.fsum(a - b for a, b in kept), abs=1e-9)
        # a sample whose tokens all count gets the difference of its two sides' sums, whatever its neighbours
        if len(kept) == len(s):
            side = lambda v: kl.segment_sum(np.asarray(v, dtype=np.float32), np.array([0, len(v)]))[0]  # noqa: E731
            assert got[i] == side([a for a, _ in kept]) - side([b for _, b in kept])
