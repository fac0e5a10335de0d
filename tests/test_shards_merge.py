"""Merged multi-turn rows (prl.shards.merge) against an independent reconstruction from the segments the turns were
built from, slime's REALIGN, FORK boundaries, rewards, and tinker-cookbook's trajectory_to_data."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.loaders.rows import Rows
from prl.loaders.tinker import tinker_arrays
from prl.shards.merge import combine_rewards, gather_column, merge_turns, plan_units, token_advantages

NOT_SAMPLED = None


def flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return values, offsets


def merge(turns: list[tuple[list[int], list[int]]], trajectory: list[int] | None = None, window: int = 4):
    prompt, p_off = flat([p for p, _ in turns])
    completion, c_off = flat([c for _, c in turns])
    traj = np.array(trajectory if trajectory is not None else [0] * len(turns))
    return merge_turns(prompt, p_off, completion, c_off, traj, window), completion


def rows_of(merged, completion: np.ndarray, logprobs: np.ndarray):
    """Per row: (input_ids, prompt_len, region as [(token, sampled logprob or None)])."""
    lp_M, sampled = merged.gather(logprobs, np.nan)
    out = []
    for r in range(merged.rows):
        a, b = merged.input_off_R1[r], merged.input_off_R1[r + 1]
        m0, m1 = merged.region_off_R1[r], merged.region_off_R1[r + 1]
        ids = merged.input_ids_T[a:b].tolist()
        plen = int(merged.prompt_len_R[r])
        region = [(ids[plen + j], float(lp_M[m0 + j]) if sampled[m0 + j] else None) for j in range(m1 - m0)]
        out.append((ids, plen, region))
    return out


def test_clean_turns_make_one_row_with_observations_unsampled():
    p0, a0, o1, a1, o2, a2 = [1, 2, 3], [10, 11], [4, 5], [12], [6], [13, 14, 15]
    turns = [(p0, a0), (p0 + a0 + o1, a1), (p0 + a0 + o1 + a1 + o2, a2)]
    merged, completion = merge(turns)
    lps = -np.arange(1, len(completion) + 1, dtype=np.float64) / 10
    assert merged.rows == 1 and merged.status_N == [None, "CLEAN", "CLEAN"]
    ids, plen, region = rows_of(merged, completion, lps)[0]
    assert ids == p0 + a0 + o1 + a1 + o2 + a2 and plen == 3
    assert region == [
        (10, -0.1),
        (11, -0.2),
        (4, None),
        (5, None),
        (12, -0.3),
        (6, None),
        (13, -0.4),
        (14, -0.5),
        (15, -0.6),
    ]
    assert (merged.merged_tokens, merged.unmerged_tokens) == (12, 5 + 8 + 12)
    assert merged.first_turn_R.tolist() == [0] and merged.last_turn_R.tolist() == [2]


def test_fork_starts_a_new_row_and_a_new_trajectory_never_merges():
    p0, a0 = [1, 2, 3], [10, 11, 12, 13, 14, 15, 16]
    edited = [1, 2, 3, 10, 99, 12, 13, 14, 15, 16, 4]  # the history's second sampled token was edited
    turns = [(p0, a0), (edited, [20]), ([*edited, 20, 5], [21]), ([*edited, 20, 5, 21, 6], [22])]
    merged, completion = merge(turns, trajectory=[0, 0, 0, 1])
    assert merged.status_N == [None, "FORK", "CLEAN", None]
    assert merged.turns_K.tolist() == [0, 1, 2, 3] and merged.turns_off_R1.tolist() == [0, 1, 3, 4]
    rows = rows_of(merged, completion, np.full(len(completion), -0.5))
    assert rows[1][0] == [*edited, 20, 5, 21] and rows[1][1] == len(edited)
    assert rows[1][2] == [(20, -0.5), (5, None), (21, -0.5)]
    assert rows[2][0] == [*edited, 20, 5, 21, 6, 22] and rows[2][1] == len(edited) + 4


def test_realign_masks_the_previous_completion_as_slime_does():
    p0, a0 = [1, 2, 3], [10, 11, 12, 13, 7]
    # the previous completion's end-of-turn (7) was re-rendered as 8 in the next prompt
    p1 = [1, 2, 3, 10, 11, 12, 13, 8, 4]
    merged, completion = merge([(p0, a0), (p1, [20, 21])], window=4)
    assert merged.status_N == [None, "REALIGN"]
    ids, plen, region = rows_of(merged, completion, np.array([-1, -2, -3, -4, -5, -6, -7], dtype=np.float64))[0]
    assert ids == [*p1, 20, 21] and plen == 3
    # the drifted completion span is overwritten from the prompt and carries no loss; the new completion does
    assert region == [(10, None), (11, None), (12, None), (13, None), (8, None), (4, None), (20, -6.0), (21, -7.0)]


def test_rewards_and_token_advantages_per_merged_row():
    turns = [([1], [2]), ([1, 2, 3], [4]), ([9], [5])]
    merged, _ = merge(turns)
    reward = np.array([0.0, 1.0, 0.5])
    assert combine_rewards(reward, merged, "last").tolist() == [1.0, 0.5]
    assert combine_rewards(reward, merged, "sum").tolist() == [1.0, 0.5]
    assert combine_rewards(reward, merged, "mean").tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="reward mode"):
        combine_rewards(reward, merged, "max")
    adv = token_advantages(np.array([2.0, -1.0]), merged)
    assert adv.tolist() == [2.0, 0.0, 2.0, -1.0]
    mask = np.array([True, True, False, True])
    assert token_advantages(np.array([2.0, -1.0]), merged, mask).tolist() == [2.0, 0.0, 0.0, -1.0]


def test_no_turns():
    merged, _ = merge([])
    assert merged.rows == 0 and merged.merged_tokens == 0 and merged.unmerged_tokens == 0


# --- independent reconstruction ----------------------------------------------------------------------------------

segment = st.lists(st.integers(0, 50), min_size=1, max_size=6)


@st.composite
def trajectories(draw):
    """Turns built from segments (first prompt, then per turn an observation tail and an action), with forks where
    an earlier action is edited in the history; plus the rows expected from those segments."""
    turns, expected = [], []
    for t in range(draw(st.integers(1, 3))):
        history = draw(segment)
        row_ids, row_plen, row_region = list(history), len(history), []
        for k in range(draw(st.integers(1, 5))):
            fork = k > 0 and draw(st.booleans()) and any(s is not None for _, s in row_region)
            if fork:  # edit the first sampled token of the history: a new row starts from the edited history
                first = next(j for j, (_, s) in enumerate(row_region) if s is not None)
                history = list(history)
                history[row_plen + first] = 1000 + history[row_plen + first]
                expected.append((row_ids, row_plen, row_region))
                obs = draw(segment)
                history = history + obs
                row_ids, row_plen, row_region = list(history), len(history), []
            elif k > 0:
                obs = draw(segment)
                history = history + obs
                row_ids += obs
                row_region += [(o, None) for o in obs]
            action = [100 + a for a in draw(segment)]
            index = sum(len(c) for _, c, _ in turns)
            turns.append((list(history), action, t))
            row_ids += action
            row_region += [(a, index + j) for j, a in enumerate(action)]
            history = history + action
        expected.append((row_ids, row_plen, row_region))
    return turns, expected


@settings(max_examples=150, deadline=None)
@given(trajectories())
def test_merged_rows_equal_the_reconstruction_from_segments(case):
    turns, expected = case
    merged, completion = merge([(p, c) for p, c, _ in turns], trajectory=[t for *_, t in turns], window=0)
    lps = -np.arange(len(completion), dtype=np.float64) - 1.0
    got = rows_of(merged, completion, lps)
    want = [
        (ids, plen, [(tok, None if s is None else float(lps[s])) for tok, s in region])
        for ids, plen, region in expected
    ]
    assert got == want
    assert merged.unmerged_tokens == sum(len(p) + len(c) for p, c, _ in turns)


# --- tinker-cookbook trajectory_to_data -------------------------------------------------------------------------


def reference_trajectory_to_data(transitions, advantage):
    """tinker-cookbook rl/data_processing.trajectory_to_data, restated from its published algorithm
    (thinking-machines-lab/tinker-cookbook, tinker_cookbook/rl/data_processing.py, commit 0f838c0): one datum while
    each observation extends the accumulated observation + action; per position a logprob (0.0 on observation
    tokens), an advantage (0 on observation tokens) and a mask; datums are the accumulation shifted by one:
    inputs = tokens[:-1], targets = tokens[1:], and the per-position lists from index 1. Returned without the mask,
    which tinker's trainers remove before sending (the advantage is 0 wherever it is 0)."""
    data, seq, lps, advs = [], [], [], []

    def emit():
        data.append((seq[:-1], seq[1:], lps[1:], advs[1:]))

    for ob, ac, ac_lps in transitions:
        if seq and ob[: len(seq)] == seq:
            delta = ob[len(seq) :]
        else:
            if seq:
                emit()
            seq, lps, advs = [], [], []
            delta = ob
        seq = seq + delta + ac
        lps = lps + [0.0] * len(delta) + ac_lps
        advs = advs + [0.0] * len(delta) + [advantage] * len(ac)
    if seq:
        emit()
    return data


def test_tinker_export_of_merged_rows_equals_trajectory_to_data():
    rng = np.random.default_rng(7)
    p0 = rng.integers(0, 1000, 9).tolist()
    acts = [rng.integers(0, 1000, n).tolist() for n in (5, 3, 8, 4)]
    obs = [rng.integers(0, 1000, n).tolist() for n in (4, 6, 2)]
    history, turns = list(p0), []
    for k, act in enumerate(acts):
        if k == 2:  # a FORK: the history's first action was re-rendered
            history = [*p0, acts[0][0] + 1, *history[len(p0) + 1 :]]
        if k:
            history = history + obs[k - 1]
        turns.append((list(history), act))
        history = history + act
    merged, completion = merge(turns, window=0)
    lps_C = (-rng.random(len(completion))).astype(np.float32)
    advantage = 0.75
    lp_M, sampled = merged.gather(lps_C, np.float32(0))
    adv_M = token_advantages(np.full(merged.rows, advantage), merged)
    region = merged.region_off_R1
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(merged.input_off_R1, merged.input_ids_T.astype(np.int32)),
            "prompt_len": pa.array(merged.prompt_len_R.astype(np.int32)),
            "behavior_logprobs": pa.ListArray.from_arrays(region, pa.array(lp_M, mask=~sampled)),
            "token_advantages": pa.ListArray.from_arrays(region, pa.array(adv_M)),
            "loss_mask": pa.ListArray.from_arrays(region, pa.array(sampled)),
            "sample_id": pa.array([f"r{i}" for i in range(merged.rows)]),
            "group_id": pa.array(["g"] * merged.rows),
            "policy_version": pa.array(["v"] * merged.rows),
            "reward": pa.array([advantage] * merged.rows),
            "advantage": pa.array([advantage] * merged.rows),
            "group_size": pa.array([1] * merged.rows),
        }
    )
    datums = tinker_arrays(Rows.from_arrow(table))
    tokens_T, tok_off, lp_J, adv_J, j_off = (
        datums.tokens_T,
        datums.tok_off_N1,
        datums.logprobs_J,
        datums.advantages_J,
        datums.j_off_N1,
    )
    got = [
        (
            tokens_T[tok_off[i] : tok_off[i + 1] - 1].tolist(),
            tokens_T[tok_off[i] + 1 : tok_off[i + 1]].tolist(),
            lp_J[j_off[i] : j_off[i + 1]].tolist(),
            adv_J[j_off[i] : j_off[i + 1]].tolist(),
        )
        for i in range(merged.rows)
    ]
    offsets = np.concatenate(([0], np.cumsum([len(a) for a in acts])))
    transitions = [(p, a, lps_C[offsets[k] : offsets[k + 1]].tolist()) for k, (p, a) in enumerate(turns)]
    want = reference_trajectory_to_data(transitions, np.float32(advantage).item())
    assert merged.rows == 2 and len(want) == 2
    assert got == want


def test_gather_column_lays_turn_columns_on_the_rows():
    turns = [([1], [2, 3]), ([1, 2, 3, 4], [5]), ([1, 2, 3, 4, 5, 6], [7, 8])]
    merged, _ = merge(turns)
    c_off = np.array([0, 2, 3, 5])
    logprobs = pa.array([[-0.5, -0.25], [-1.0], [None, -2.0]], pa.list_(pa.float32()))
    assert gather_column(logprobs, c_off, merged).to_pylist() == [[-0.5, -0.25, None, -1.0, None, None, -2.0]]
    heads = pa.array([[[2, 9], [3, 9]], None, [[7, 1], [8, 1]]], pa.list_(pa.list_(pa.int32())))
    assert gather_column(heads, c_off, merged).to_pylist() == [[[2, 9], [3, 9], None, None, None, [7, 1], [8, 1]]]
    chunked = pa.chunked_array([logprobs.slice(0, 1), logprobs.slice(1)])
    assert gather_column(chunked, c_off, merged).equals(gather_column(logprobs, c_off, merged))


def plan_frame(rows):
    """Candidate turns: (sample_id, agent, turn, kept, prefix_status, score, prompt_len, completion_len)."""
    n = len(rows)
    cols = list(zip(*rows, strict=True))
    return pl.DataFrame(
        {
            "row": list(range(n)),
            "sample_id": cols[0],
            "request_id": cols[0],
            "session_id": ["s"] * n,
            "agent_id": cols[1],
            "turn": cols[2],
            "created_at": [None] * n,
            "source_uri": ["file:///a"] * n,
            "source_line": list(range(n)),
            "kept": cols[3],
            "prefix_status": cols[4],
            "group_id": ["g-" + s for s in cols[0]],
            "score": cols[5],
            "prompt_len": cols[6],
            "completion_len": cols[7],
        },
        schema_overrides={"turn": pl.Int32, "created_at": pl.Datetime("us", "UTC"), "prefix_status": pl.String},
    )


def test_plan_units_follow_prefix_status_and_kept_predecessors():
    plan = plan_frame(
        [
            ("p0", "planner", 0, True, None, 0.0, 10, 5),
            ("w0", "worker", 0, True, None, 0.2, 8, 4),
            ("p1", "planner", 1, True, "CLEAN", 1.0, 20, 6),
            ("w1", "worker", 1, True, "CLEAN", 0.4, 16, 3),
            ("w2", "worker", 2, False, "FORK", 0.0, 30, 2),  # dropped (drift): the worker's row ends before it
            ("w3", "worker", 3, True, "CLEAN", 0.9, 40, 7),
            ("p2", "planner", 2, True, "REALIGN", 0.5, 29, 4),
        ]
    )
    units = plan_units(plan, "last")
    got = units.select("sample_id", "group_id", "score", "prompt_len", "completion_len", "turns").rows()
    assert sorted(got) == [
        ("p0", "g-p0", 0.5, 10, 29 + 4 - 10, 3),
        ("w0", "g-w0", 0.4, 8, 16 + 3 - 8, 2),
        ("w3", "g-w3", 0.9, 40, 7, 1),
    ]
    rows = {r[0]: r[1] for r in units.select("sample_id", "turn_rows").rows()}
    assert rows == {"p0": [0, 2, 6], "w0": [1, 3], "w3": [5]}
    assert sorted(plan_units(plan, "sum").get_column("score").to_list()) == [0.6000000000000001, 0.9, 1.5]
    with pytest.raises(ValueError, match="reward mode"):
        plan_units(plan, "first")


def test_plan_units_start_a_row_where_sampling_settings_change():
    plan = plan_frame(
        [
            ("a0", "a", 0, True, None, 0.0, 4, 2),
            ("a1", "a", 1, True, "CLEAN", 1.0, 8, 2),
            ("a2", "a", 2, True, "CLEAN", 0.5, 12, 2),
            ("a3", "a", 3, True, "CLEAN", 0.25, 16, 2),
        ]
    ).with_columns(
        pl.Series("temperature", [0.7, 0.7, 1.0, 1.0], pl.Float32),
        pl.Series("logprobs_mode", [None, None, None, "processed_logprobs"]),
    )
    units = plan_units(plan, "last")
    assert units.select("sample_id", "turn_rows", "score").rows() == [
        ("a0", [0, 1], 1.0),
        ("a2", [2], 0.5),
        ("a3", [3], 0.25),
    ]
