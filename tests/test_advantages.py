"""Advantages against plain-loop reference values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.numerics.advantages import combine_rewards, compute_advantages, constant_groups, dense_index


def reference(rewards, groups, method, fallback=None):
    """Loop implementation: one group at a time."""
    out = []
    for i, r in enumerate(rewards):
        members = [j for j in range(len(rewards)) if groups[j] == groups[i]]
        if len(members) == 1:
            if fallback is None:
                out.append(0.0)
                continue
            members = [j for j in range(len(rewards)) if fallback[j] == fallback[i]]
            if len(members) == 1:
                out.append(0.0)
                continue
        vals = [rewards[j] for j in members]
        g = len(vals)
        mean = sum(vals) / g
        if method == "mean":
            out.append(r - mean)
        elif method == "loo":
            out.append(r - (sum(vals) - r) / (g - 1))
        else:
            sd = (sum((v - mean) ** 2 for v in vals) / (g - 1)) ** 0.5
            out.append((r - mean) / (sd + 1e-6))
    return np.array(out)


def test_mean_centering_exact():
    res = compute_advantages(np.array([1.0, 0.0, 0.5, 3.0]), np.array([0, 0, 1, 1]))
    np.testing.assert_allclose(res.advantages_N, [0.5, -0.5, -1.25, 1.25])
    assert res.group_size_N.tolist() == [2, 2, 2, 2]
    assert res.singleton_groups == 0


def test_leave_one_out_exact():
    # group of three: r - mean(others)
    res = compute_advantages(np.array([1.0, 2.0, 6.0]), np.zeros(3, dtype=int), "loo")
    np.testing.assert_allclose(res.advantages_N, [1 - 4.0, 2 - 3.5, 6 - 1.5])


def test_std_scaling_unbiased():
    r = np.array([1.0, 2.0, 3.0])
    res = compute_advantages(r, np.zeros(3, dtype=int), "std")
    np.testing.assert_allclose(res.advantages_N, [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6)])


def test_singletons_fall_back_to_batch_and_are_counted():
    r = np.array([1.0, 0.0, 0.0, 2.0])
    groups = np.array([0, 1, 2, 3])  # every prompt seen once
    res = compute_advantages(r, groups, "mean", fallback_index_N=np.zeros(4, dtype=int))
    np.testing.assert_allclose(res.advantages_N, r - 0.75)
    assert res.singleton_groups == 4
    assert res.singletons_without_baseline == 0


def test_singletons_by_field_and_without_baseline():
    r = np.array([1.0, 3.0, 5.0, 7.0])
    groups = np.array([0, 0, 1, 2])
    task = np.array([0, 0, 0, 1])  # sample 2 (task 0) has a baseline; sample 3 (task 1) has none
    res = compute_advantages(r, groups, "mean", fallback_index_N=task)
    np.testing.assert_allclose(res.advantages_N, [-1.0, 1.0, 5.0 - 3.0, 0.0])
    assert (res.singleton_groups, res.singletons_without_baseline) == (2, 1)


def test_singletons_without_fallback_get_zero():
    res = compute_advantages(np.array([4.0, 1.0, 2.0]), np.array([0, 1, 1]), "loo")
    np.testing.assert_allclose(res.advantages_N, [0.0, -1.0, 1.0])
    assert res.singletons_without_baseline == 1


def test_constant_groups_dropped_and_counted():
    r = np.array([1.0, 1.0, 0.0, 1.0, 5.0])
    groups = np.array([0, 0, 1, 1, 2])
    res = compute_advantages(r, groups, "mean", drop_constant=True)
    assert res.keep_N.tolist() == [False, False, True, True, True]
    assert (res.constant_groups_dropped, res.constant_samples_dropped) == (1, 2)
    assert np.isnan(res.advantages_N[:2]).all()
    np.testing.assert_allclose(res.advantages_N[2:], [-0.5, 0.5, 0.0])
    assert constant_groups(r, groups, 3).tolist() == [True, False, False]


def test_constant_detection_is_exact_not_mean_based():
    r = np.array([0.1, 0.1, 0.1])  # sum/3 != 0.1 in floating point
    assert constant_groups(r, np.zeros(3, dtype=int), 1).tolist() == [True]


def test_empty_input():
    res = compute_advantages(np.array([]), np.array([], dtype=int), "std", np.array([], dtype=int), True)
    assert res.advantages_N.shape == (0,) and res.singleton_groups == 0


def test_nonfinite_rewards_rejected():
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(np.array([1.0, np.nan]), np.array([0, 0]))


def test_unknown_method():
    with pytest.raises(ValueError, match="unknown advantage method"):
        compute_advantages(np.array([1.0]), np.array([0]), "gae")


def test_combine_rewards_weighted_sum_and_missing():
    comps = {"a": np.array([1.0, np.nan]), "b": np.array([2.0, 3.0])}
    out = combine_rewards(comps, {"a": 0.5, "b": 2.0})
    assert out[0] == 4.5 and np.isnan(out[1])
    with pytest.raises(KeyError):
        combine_rewards(comps, {"c": 1.0})


def test_dense_index_strings_and_nulls():
    idx, n = dense_index(pa.array(["x", "y", "x", None, None]))
    assert n == 3 and idx.tolist() == [0, 1, 0, 2, 2]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(-4, 4), st.integers(0, 1)), min_size=0, max_size=25),
    st.sampled_from(["mean", "loo", "std"]),
    st.booleans(),
)
def test_matches_loop_reference(rows, method, use_fallback):
    groups = np.array([g for g, _, _ in rows], dtype=np.int64)
    rewards = np.array([r / 2 for _, r, _ in rows], dtype=np.float64)
    fallback = np.array([f for _, _, f in rows], dtype=np.int64) if use_fallback else None
    _, groups = np.unique(groups, return_inverse=True)
    res = compute_advantages(rewards, groups, method, fallback)
    expected = reference(rewards.tolist(), groups.tolist(), method, None if fallback is None else fallback.tolist())
    np.testing.assert_allclose(res.advantages_N, expected, rtol=1e-9, atol=1e-9)
    sizes = [int((groups == g).sum()) for g in groups]
    assert res.group_size_N.tolist() == sizes
    assert res.singleton_groups == sizes.count(1)


def test_reward_weights_from_command_line_text():
    from prl.errors import UsageError
    from prl.shards.options import ShardOptions

    assert ShardOptions.from_mapping({"rewards": "correct=1,format=0.25"}).rewards == {"correct": 1.0, "format": 0.25}
    assert ShardOptions.from_mapping({"rewards": "score"}).rewards == {"score": 1.0}
    with pytest.raises(UsageError, match="NAME=WEIGHT"):
        ShardOptions.from_mapping({"rewards": "correct=high"})
