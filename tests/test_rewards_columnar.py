"""Reward JSONL blocks read columnar give exactly the events the per-row reader gives, or defer to it."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from prl.ingestion.rewards_columnar import reward_block
from prl.ingestion.side_tables import ingest_side_table, reward_events

NOW = 1_764_460_800_000
NUMBERS = st.one_of(st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6, allow_nan=False))
STAMPS = st.one_of(
    st.integers(0, 2 * 10**9), st.integers(10**12, 2 * 10**12), st.floats(0, 2e9, allow_nan=False), st.just(-5)
)


@st.composite
def rows(draw: st.DrawFn) -> dict:
    row: dict = {"sample_id": draw(st.sampled_from(["a#0", "b#1", "c#0"]))}
    if draw(st.booleans()):
        row.update(name=draw(st.sampled_from(["correct", "format"])), value=draw(NUMBERS))
    else:
        row["reward"] = draw(NUMBERS)
    if draw(st.booleans()):
        row["created_at"] = draw(STAMPS)
    return row


@settings(max_examples=200, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=6), st.booleans())
def test_columnar_block_equals_per_row_events(batch: list[dict], same_keys: bool) -> None:
    if same_keys:  # one shape per block: the columnar reader takes it when every value is readable
        batch = [{**batch[0], "sample_id": r["sample_id"]} for r in batch]
    block = "".join(json.dumps(r) + "\n" for r in batch).encode()
    fast = reward_block(block, 7, "u", NOW)
    try:
        expected = [e for r in batch for e in reward_events(r, NOW)]
    except Exception:
        assert fast is None  # a bad row: the per-row reader explains it
        return
    if fast is None:
        return
    out, lines = fast
    assert lines.tolist() == list(range(7, 7 + len(batch)))
    got = out.to_pylist()
    assert [(g["sample_id"], g["name"], g["value"]) for g in got] == [
        (e["sample_id"], e["name"], e["value"]) for e in expected
    ]
    assert [round(g["created_at"].timestamp() * 1000) for g in got] == [e["created_at"] for e in expected]
    assert all(g["source_uri"] == "u" for g in got)


def test_other_shapes_and_blank_lines_take_the_row_path() -> None:
    for block in (
        b'{"sample_id": "a", "rewards": {"x": 1}}\n',
        b'{"request_id": "r", "choice_index": 0.0, "reward": 1}\n',
        b'{"request_id": "r", "choice_index": 0, "sample_id": "r#0", "reward": 1}\n',
        b'{"sample_id": "a", "reward": 1}\n\n{"sample_id": "b", "reward": 0}\n',
        b'{"sample_id": "a", "reward": "0.5"}\n',
        b'{"sample_id": "a", "reward": 1, "created_at": "2025-01-01T00:00:00Z"}\n',
        b'{"sample_id": "", "reward": 1}\n',
        b'{"sample_id": "a", "reward": null}\n',
        b"[1, 2]\n",
    ):
        assert reward_block(block, 1, "u", NOW) is None, block


def test_a_bad_row_is_quarantined_and_its_good_neighbours_kept(store, write_trace):
    good = [{"sample_id": f"s{i}#0", "reward": i % 2} for i in range(5)]
    path = write_trace("r.jsonl", [*good[:2], {"sample_id": "s9#0", "reward": "nope"}, *good[2:]])
    result = ingest_side_table([str(path)], store, kind="rewards")
    assert (result.rows, result.quarantined) == (5, {"bad_value": 1})
    table = store.read("rewards").sort_by("source_line")
    assert table.column("source_line").to_pylist() == [1, 2, 4, 5, 6]


def test_a_grown_file_adds_only_its_new_lines_columnar(store, write_trace):
    rows_ = [{"sample_id": f"s{i}#0", "reward": 1.0} for i in range(4)]
    path = write_trace("g.jsonl", rows_[:2])
    ingest_side_table([str(path)], store, kind="rewards")
    size = path.stat().st_size
    path = write_trace("g.jsonl", rows_)  # rewritten with two more lines: a new identity, the same first bytes
    grown = ingest_side_table([str(path)], store, kind="rewards")
    assert (grown.rows, grown.already_present, grown.resumed_from) == (2, 0, {str(path): size})
    assert sorted(store.read("rewards").column("sample_id").to_pylist()) == [f"s{i}#0" for i in range(4)]
