"""Policy versions, per-token version spans and sampling settings of merged rows (prl.shards.merge_sampling),
against values worked out by hand and (hypothesis) a token-by-token reconstruction."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.schema import VERSION_SPAN
from prl.shards.merge import merge_turns
from prl.shards.merge_sampling import merged_spans, oldest_turn, settings_change

SPANS = pa.list_(VERSION_SPAN)


def flat(rows):
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return values, offsets


def merged(turns, trajectory, window=4):
    prompt, p_off = flat([p for p, _ in turns])
    completion, c_off = flat([c for _, c in turns])
    return merge_turns(prompt, p_off, completion, c_off, np.array(trajectory), window), c_off


def span(version, start, end):
    return {"version": version, "start": start, "end": end}


# three CLEAN turns of one row (completions at region positions 0-1, 3-4, 7) and a turn of its own
TURNS = [
    ([1, 2], [10, 11]),
    ([1, 2, 10, 11, 5], [12, 13]),
    ([1, 2, 10, 11, 5, 12, 13, 6, 7], [14]),
    ([9], [20, 21]),
]


def test_spans_cover_sampled_positions_only_with_each_turns_version():
    rows, c_off = merged(TURNS, [0, 0, 0, 1])
    versions = pa.array(["step-3", "step-4", "step-4", "step-2"])
    spans = merged_spans(versions, pa.nulls(4, SPANS), c_off, rows)
    assert spans.to_pylist() == [
        [span("step-3", 0, 2), span("step-4", 3, 5), span("step-4", 7, 8)],
        None,  # one version, no spans of its own: as an unmerged sample
    ]


def test_a_turns_own_spans_are_shifted_to_its_place_and_unknown_versions_stay_null():
    rows, c_off = merged(TURNS, [0, 0, 0, 1])
    versions = pa.array(["a", "b", None, "c"])
    own = pa.array([None, [span("a", 0, 1), span("b", 1, 2)], None, [span("c", 0, 2)]], SPANS)
    assert merged_spans(versions, own, c_off, rows).to_pylist() == [
        [span("a", 0, 2), span("a", 3, 4), span("b", 4, 5), span(None, 7, 8)],
        [span("c", 0, 2)],  # a turn that had spans keeps them
    ]
    same = pa.array(["a", "a", "a", "c"])
    assert merged_spans(same, pa.nulls(4, SPANS), c_off, rows).to_pylist() == [None, None]


def test_realign_overwritten_tokens_lie_in_no_span():
    p0, a0 = [1, 2, 3], [10, 11, 12, 13, 7]
    rows, c_off = merged([(p0, a0), ([1, 2, 3, 10, 11, 12, 13, 8, 4], [20, 21])], [0, 0])
    spans = merged_spans(pa.array(["v1", "v2"]), pa.nulls(2, SPANS), c_off, rows)
    assert rows.status_N == [None, "REALIGN"]
    assert spans.to_pylist() == [[span("v2", 6, 8)]]


def test_the_oldest_turn_names_the_rows_version():
    rows, _ = merged(TURNS, [0, 0, 0, 1])
    assert oldest_turn(np.array([1.0, 3.0, 3.0, np.nan]), rows).tolist() == [1, 3]
    assert oldest_turn(np.array([np.nan, np.nan, np.nan, np.nan]), rows).tolist() == [0, 3]
    empty, _ = merged([], [])
    assert oldest_turn(np.zeros(0), empty).tolist() == []


def test_settings_change_compares_nulls_as_values():
    turns = pl.DataFrame(
        {
            "temperature": [0.7, 0.7, None, None, 1.0],
            "top_k": [None, None, None, 20, 20],
            "other": [1, 2, 3, 4, 5],
        },
        schema_overrides={"temperature": pl.Float32, "top_k": pl.Int32},
    )
    assert settings_change(turns).to_list() == [False, False, True, True, True]
    assert settings_change(turns.select("other")).to_list() == [False] * 5
    assert settings_change(turns.head(0)).to_list() == []


# --- reconstruction token by token ------------------------------------------------------------------------------

tokens = st.lists(st.integers(0, 30), min_size=1, max_size=5)
version = st.sampled_from(["v1", "v2", "v3", None])


@st.composite
def trajectories(draw):
    """Turns whose prompts extend the history (CLEAN), some re-rendering the last completion token (REALIGN),
    some editing the start of the history (FORK); versions per turn and random spans."""
    turns, traj, versions, spans = [], [], [], []
    for t in range(draw(st.integers(1, 3))):
        history = draw(tokens)
        for k in range(draw(st.integers(1, 4))):
            if k:
                kind = draw(st.sampled_from(["clean", "realign", "fork"]))
                if kind == "realign":
                    history = [*history[:-1], 1000 + history[-1]]
                elif kind == "fork":
                    history = [2000 + history[0], *history[1:]]
                history = history + draw(tokens)
            completion = [100 + x for x in draw(tokens)]
            turns.append((list(history), completion))
            traj.append(t)
            versions.append(draw(version))
            n = len(completion)
            own = draw(
                st.none()
                | st.lists(
                    st.tuples(version, st.integers(-1, n + 1), st.integers(-1, n + 1)).map(lambda s: span(*s)),
                    max_size=3,
                )
            )
            spans.append(own)
            history = history + completion
    return turns, traj, versions, spans


def expected_spans(rows, c_off, versions, spans):
    """Per row: each region position's version, token by token, run-length encoded over sampled positions."""
    out = []
    for r in range(rows.rows):
        m0, m1 = rows.region_off_R1[r], rows.region_off_R1[r + 1]
        per_pos = []
        for src in rows.source_M[m0:m1].tolist():
            if src < 0:
                per_pos.append(("none",))
                continue
            turn = int(np.searchsorted(c_off, src, side="right") - 1)
            pos, v = src - c_off[turn], versions[turn]
            for s in spans[turn] or []:
                if s["start"] <= pos < s["end"]:
                    v = s["version"]
            per_pos.append(("v", v))
        runs = []
        for j, p in enumerate(per_pos):
            if p[0] == "v":
                if runs and runs[-1]["end"] == j and runs[-1]["version"] == p[1]:
                    runs[-1]["end"] = j + 1
                else:
                    runs.append(span(p[1], j, j + 1))
        turns = rows.turns_K[rows.turns_off_R1[r] : rows.turns_off_R1[r + 1]].tolist()
        had_spans = any(spans[t] for t in turns)
        out.append(runs if had_spans or len({versions[t] for t in turns}) > 1 else None)
    return out


@settings(max_examples=150, deadline=None)
@given(trajectories())
def test_spans_equal_the_token_by_token_reconstruction(case):
    turns, traj, versions, spans = case
    rows, c_off = merged(turns, traj, window=1)
    got = merged_spans(pa.array(versions, pa.string()), pa.array(spans, SPANS), c_off, rows).to_pylist()
    assert got == expected_spans(rows, c_off, versions, spans)
