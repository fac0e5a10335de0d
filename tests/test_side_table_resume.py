"""Reward and reference JSONL files read on from where the last run stopped (``prl.ingestion.side_resume``): a
grown file costs its new bytes only, a rotated, truncated or rewritten one is read from its start, and the rows
(event ids included: identical lines keep counting across runs) are those of runs that read every file whole."""

from __future__ import annotations

import json
import random

import pytest

import prl.ingestion.side_resume as side_resume
import prl.ingestion.side_tables as side_tables
from prl.event_ids import Occurrences, reward_content
from prl.ingestion.side_tables import ingest_side_table
from prl.store.tables import Store

COLUMNS = ["sample_id", "name", "value", "source_uri", "source_line", "event_id"]
REF_COLUMNS = ["sample_id", "ref_model", "ref_logprobs", "source_uri", "source_line", "event_id"]


def reward_line(rng: random.Random) -> str:
    """A reward row of a shape drawn at random, often equal to an earlier one (no time: identical events)."""
    sample = f"s{rng.randrange(4)}#0"
    shape = rng.randrange(4)
    if shape == 0:
        return json.dumps({"sample_id": sample, "reward": rng.choice([0.0, 1.0])})
    if shape == 1:
        return json.dumps({"sample_id": sample, "name": "fmt", "value": 0.5, "created_at": 1_790_000_000})
    if shape == 2:  # the per-row path: components
        return json.dumps({"sample_id": sample, "rewards": {"correct": rng.choice([0, 1]), "len": 0.25}})
    return rng.choice(['{"sample_id": "s1#0", "reward": "nope"}', "not json"])  # quarantined


def append(path, lines: list[str]) -> int:
    """Append whole lines; the file's size before."""
    size = path.stat().st_size if path.exists() else 0
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(f"{x}\n" for x in lines))
    return size


def rows(store: Store, table: str = "rewards") -> list[tuple]:
    """The table's rows without the ingest times, sorted (duplicates kept)."""
    columns = COLUMNS if table == "rewards" else REF_COLUMNS
    data = store.read(table, columns=columns).to_pylist()
    return sorted(tuple(json.dumps(r[c]) for c in columns) for r in data)


def quarantined(store: Store) -> list[tuple]:
    data = store.read("quarantine", columns=["source_uri", "source_line", "reason"]).to_pylist()
    return sorted((r["source_uri"], r["source_line"], r["reason"]) for r in data)


@pytest.fixture
def whole(monkeypatch):
    """Run ``ingest_side_table`` as if no earlier run had left a resume point: every file read whole."""

    def ingest_whole(*args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(side_tables, "earlier_entries", lambda *a: {})
            return ingest_side_table(*args, **kwargs)

    return ingest_whole


def test_a_grown_rewards_file_is_read_from_its_offset_with_the_rows_of_whole_reads(tmp_path, whole):
    rng = random.Random(7)
    path = tmp_path / "rewards.jsonl"
    resumed, read_whole = Store(str(tmp_path / "resumed")), Store(str(tmp_path / "whole"))
    append(path, [reward_line(rng) for _ in range(30)])
    ingest_side_table([str(path)], resumed, kind="rewards")
    whole([str(path)], read_whole, kind="rewards")
    for _ in range(6):
        size = append(path, [reward_line(rng) for _ in range(rng.randrange(1, 12))])
        result = ingest_side_table([str(path)], resumed, kind="rewards")
        assert (result.resumed_from, result.bytes_read) == ({str(path): size}, path.stat().st_size - size)
        assert result.already_present == 0  # nothing before the point is read again
        reference = whole([str(path)], read_whole, kind="rewards")
        assert (reference.resumed_from, reference.bytes_read) == ({}, path.stat().st_size)
        assert result.rows == reference.rows
        assert rows(resumed) == rows(read_whole)
        assert quarantined(resumed) == quarantined(read_whole)
    assert len({r[5] for r in rows(resumed)}) == len(rows(resumed))  # event ids: one per row
    identical = [r for r in rows(resumed) if r[:3] == (json.dumps("s0#0"), json.dumps("reward"), json.dumps(1.0))]
    assert len(identical) > 2  # identical lines on both sides of the points, each its own occurrence


def test_a_rotated_rewards_file_is_read_from_its_start(tmp_path, whole):
    rng = random.Random(3)
    path = tmp_path / "rewards.jsonl"
    resumed, read_whole = Store(str(tmp_path / "resumed")), Store(str(tmp_path / "whole"))
    first = [reward_line(rng) for _ in range(20)]
    append(path, first)
    for store, ingest in ((resumed, ingest_side_table), (read_whole, whole)):
        ingest([str(path)], store, kind="rewards")
    path.unlink()  # rotated: the same name, new content longer than what was consumed
    append(path, [reward_line(rng) for _ in range(12)] + first[:5] + [reward_line(rng) for _ in range(12)])
    result = ingest_side_table([str(path)], resumed, kind="rewards")
    assert (result.resumed_from, result.bytes_read) == ({}, path.stat().st_size)
    reference = whole([str(path)], read_whole, kind="rewards")
    assert (result.rows, result.already_present) == (reference.rows, reference.already_present)
    assert result.already_present > 0  # the lines rotated in again are recognised by content
    assert rows(resumed) == rows(read_whole)
    size = append(path, [reward_line(rng) for _ in range(5)])  # and the rotated file resumes from its own point
    assert ingest_side_table([str(path)], resumed, kind="rewards").resumed_from == {str(path): size}
    whole([str(path)], read_whole, kind="rewards")
    assert rows(resumed) == rows(read_whole)


def test_a_truncated_or_rewritten_file_is_read_from_its_start(tmp_path):
    path = tmp_path / "rewards.jsonl"
    store = Store(str(tmp_path / "store"))
    append(path, [json.dumps({"sample_id": f"s{i}#0", "reward": 1.0}) for i in range(6)])
    ingest_side_table([str(path)], store, kind="rewards")
    path.write_text("".join(json.dumps({"sample_id": f"s{i}#0", "reward": 1.0}) + "\n" for i in range(3)))
    cut = ingest_side_table([str(path)], store, kind="rewards")  # shorter than the point
    assert (cut.resumed_from, cut.bytes_read, cut.rows, cut.already_present) == ({}, path.stat().st_size, 0, 3)
    text = path.read_text()
    path.write_text(text.replace('"s0#0"', '"t0#0"') + json.dumps({"sample_id": "s9#0", "reward": 0.0}) + "\n")
    changed = ingest_side_table([str(path)], store, kind="rewards")  # same length up to the point, other bytes
    assert (changed.resumed_from, changed.rows, changed.already_present) == ({}, 2, 2)


def test_a_grown_reference_file_is_read_from_its_offset(tmp_path, whole):
    path = tmp_path / "ref.jsonl"
    resumed, read_whole = Store(str(tmp_path / "resumed")), Store(str(tmp_path / "whole"))

    def ref(i: int) -> str:
        return json.dumps({"sample_id": f"s{i % 5}#0", "ref_model": "m", "ref_logprobs": [-0.5, -float(i % 3)]})

    append(path, [ref(i) for i in range(8)])
    for store, ingest in ((resumed, ingest_side_table), (read_whole, whole)):
        ingest([str(path)], store, kind="ref")
    size = append(path, [ref(i) for i in range(8, 20)])
    result = ingest_side_table([str(path)], resumed, kind="ref")
    assert (result.resumed_from, result.bytes_read) == ({str(path): size}, path.stat().st_size - size)
    reference = whole([str(path)], read_whole, kind="ref")
    assert result.rows == reference.rows and rows(resumed, "ref_logprobs") == rows(read_whole, "ref_logprobs")


def test_an_unterminated_last_line_that_was_read_leaves_no_point(tmp_path):
    path = tmp_path / "rewards.jsonl"
    store = Store(str(tmp_path / "store"))
    path.write_text('{"sample_id": "a#0", "reward": 1.0}\n{"sample_id": "b#0", "reward": 1.0}')
    first = ingest_side_table([str(path)], store, kind="rewards", partial_line_grace=0)  # stopped changing
    assert (first.rows, first.held_back_bytes) == (2, 0)  # its last line read without a newline
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('\n{"sample_id": "b#0", "reward": 1.0}\n')  # the same event again: its second occurrence
    again = ingest_side_table([str(path)], store, kind="rewards", partial_line_grace=0)
    assert (again.resumed_from, again.bytes_read, again.rows, again.already_present) == ({}, path.stat().st_size, 1, 2)
    assert sorted(store.read("rewards", columns=["sample_id"]).column("sample_id").to_pylist()) == [
        "a#0",
        "b#0",
        "b#0",
    ]


def test_occurrence_counts_round_trip_and_a_damaged_record_is_none():
    counts = Occurrences()
    contents = [reward_content("a#0", "reward", 1.0, None)] * 3 + [reward_content("b#0", "reward", 0.0, 5)]
    ids = counts.ids(contents)
    again = Occurrences.from_json(counts.to_json())
    assert again is not None and len(again) == len(counts) == 2
    more = [reward_content("a#0", "reward", 1.0, None), reward_content("b#0", "reward", 0.0, 5)]
    assert again.ids(more) == Occurrences().ids(contents + more)[len(contents) :]  # counts carry over exactly
    assert len(set(ids)) == 4
    for damaged in (None, 7, "not base64!", counts.to_json()[:-4]):
        assert Occurrences.from_json(damaged) is None
    empty = Occurrences.from_json("")
    assert empty is not None and len(empty) == 0


def test_a_damaged_resume_entry_means_a_read_from_the_start(tmp_path, monkeypatch):
    path = tmp_path / "rewards.jsonl"
    store = Store(str(tmp_path / "store"))
    append(path, [json.dumps({"sample_id": "a#0", "reward": 1.0})] * 3)
    ingest_side_table([str(path)], store, kind="rewards")
    append(path, [json.dumps({"sample_id": "a#0", "reward": 1.0})])
    real = side_tables.earlier_entries

    def damaged(*args):
        return {uri: {**entry, "occurrences": "%%%"} for uri, entry in real(*args).items()}

    monkeypatch.setattr(side_tables, "earlier_entries", damaged)
    result = ingest_side_table([str(path)], store, kind="rewards")
    assert (result.resumed_from, result.bytes_read, result.rows, result.already_present) == (
        {},
        path.stat().st_size,
        1,
        3,
    )


def test_a_file_of_more_distinct_events_than_the_ledger_keeps_is_read_from_its_start(tmp_path, monkeypatch):
    monkeypatch.setattr(side_resume, "MAX_OCCURRENCES", 3)
    path = tmp_path / "rewards.jsonl"
    store = Store(str(tmp_path / "store"))
    append(path, [json.dumps({"sample_id": f"s{i % 3}#0", "reward": 1.0}) for i in range(6)])  # 3 distinct
    ingest_side_table([str(path)], store, kind="rewards")
    first = append(path, [json.dumps({"sample_id": "s3#0", "reward": 1.0})])  # a 4th distinct event
    assert ingest_side_table([str(path)], store, kind="rewards").resumed_from == {str(path): first}
    append(path, [json.dumps({"sample_id": "s0#0", "reward": 1.0})])
    # that run recorded no point (4 distinct events): this one continues from the first run's, still valid
    later = ingest_side_table([str(path)], store, kind="rewards")
    assert (later.resumed_from, later.bytes_read, later.rows, later.already_present) == (
        {str(path): first},
        path.stat().st_size - first,
        1,
        1,
    )
    fresh = tmp_path / "fresh.jsonl"
    append(fresh, [json.dumps({"sample_id": f"t{i}#0", "reward": 1.0}) for i in range(4)])  # over the cap at once
    ingest_side_table([str(fresh)], store, kind="rewards")
    append(fresh, [json.dumps({"sample_id": "t0#0", "reward": 1.0})])
    again = ingest_side_table([str(fresh)], store, kind="rewards")
    assert (again.resumed_from, again.bytes_read, again.rows, again.already_present) == (
        {},
        fresh.stat().st_size,
        1,
        4,
    )
