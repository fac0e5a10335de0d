"""Side tables recognise events by content (``event_id``), not by file name and line: rotated, renamed, grown
and rewritten files add exactly their new events (rows of older stores get theirs from ``prl maintain --upgrade``:
tests/test_store_format.py)."""

from __future__ import annotations

import json
import os
import time

import polars as pl
import pyarrow as pa
import pytest

from prl.event_ids import Occurrences, ref_id, reward_content, reward_contents, reward_id, reward_ids
from prl.ingestion.side_tables import ingest_side_table
from prl.ingestion.traces import ingest
from prl.schema import REWARDS
from prl.store.index import EVENT_INDEXES, SampleIndex
from tests.formats_helpers import FIXTURES
from tests.records import vllm_chat


def rewards(store) -> list[tuple]:
    df = pl.read_delta(store.table_uri("rewards"))
    return sorted(df.select("sample_id", "name", "value").rows())


def line(sample_id: str, value: float, at: int | None = 1_790_000_000, name: str = "reward") -> str:
    row: dict = {"sample_id": sample_id, "name": name, "value": value}
    if at is not None:
        row["created_at"] = at
    return json.dumps(row)


def write(path, lines: list[str], mtime_s: float | None = None) -> None:
    path.write_text("".join(f"{x}\n" for x in lines))
    if mtime_s is not None:
        os.utime(path, (mtime_s, mtime_s))


def test_event_ids_are_content_digests_with_occurrences():
    first = reward_id("a#0", "reward", 1.0, 1_790_000_000_000)
    assert len(first) == 32 and first == reward_id("a#0", "reward", 1.0, 1_790_000_000_000)
    assert first != reward_id("a#0", "reward", 1.0, None) != reward_id("a#0", "reward", 0.5, None)
    occurrences = Occurrences()
    content = reward_content("a#0", "reward", 1.0, 1_790_000_000_000)
    twice = occurrences.ids([content, content])
    assert twice[0] == first and twice[1] != first
    assert ref_id("a#0", "base", pa.array([-0.5], pa.float32()).to_numpy()) != ref_id(
        "a#0", "other", pa.array([-0.5], pa.float32()).to_numpy()
    )


@pytest.mark.parametrize("shape", ["long", "columnar_reward", "components"])
def test_a_rotated_rewards_file_adds_its_new_events(store, tmp_path, shape):
    """Same name, new content: every new event lands, the old ones stay once (a rewrite of the file with
    the old events at other lines is recognised too)."""

    def rows(ids: list[str]) -> list[str]:
        if shape == "long":
            return [line(i, 1.0) for i in ids]
        if shape == "columnar_reward":
            return [json.dumps({"sample_id": i, "reward": 1.0, "created_at": 1_790_000_000}) for i in ids]
        return [json.dumps({"sample_id": i, "rewards": {"reward": 1.0}, "created_at": 1_790_000_000}) for i in ids]

    path = tmp_path / "rewards.jsonl"
    write(path, rows(["a#0", "b#0"]), mtime_s=time.time() - 3600)
    assert ingest_side_table([str(path)], store, kind="rewards").rows == 2
    write(path, rows(["c#0", "b#0", "d#0"]))  # rotated: c and d new, b carried over at another line
    rotated = ingest_side_table([str(path)], store, kind="rewards")
    assert (rotated.rows, rotated.already_present, rotated.quarantined) == (2, 1, {})
    assert rewards(store) == [(s, "reward", 1.0) for s in ("a#0", "b#0", "c#0", "d#0")]
    ids = pl.read_delta(store.table_uri("rewards"))["event_id"].to_list()
    assert len(set(ids)) == 4 and all(len(i) == 32 for i in ids)


def test_a_renamed_copy_adds_nothing_and_a_grown_one_only_its_tail(store, tmp_path):
    live, old = tmp_path / "rewards.jsonl", tmp_path / "rewards.jsonl.1"
    write(live, [line("a#0", 1.0), line("b#0", 0.0)])
    ingest_side_table([str(live)], store, kind="rewards")
    os.rename(live, old)  # logrotate: the old file is renamed, the glob sees it under its new name
    write(live, [line("c#0", 0.5)])
    result = ingest_side_table([str(tmp_path / "rewards.jsonl*")], store, kind="rewards")
    assert (result.files, result.rows, result.already_present) == (2, 1, 2)
    size = old.stat().st_size
    with open(old, "a") as fh:
        fh.write(line("d#0", 0.25) + "\n")
    grown = ingest_side_table([str(tmp_path / "rewards.jsonl*")], store, kind="rewards")
    assert (grown.files, grown.unchanged_files, grown.rows, grown.already_present) == (1, 1, 1, 0)
    assert grown.resumed_from == {str(old): size}  # the renamed file's own read left a point
    assert [r[0] for r in rewards(store)] == ["a#0", "b#0", "c#0", "d#0"]


def test_identical_events_without_a_time_are_separate_occurrences(store, tmp_path):
    """A, B, A without times: the later A supersedes B, so both As are kept (and a rerun adds neither)."""
    path = tmp_path / "r.jsonl"
    write(path, [line("a#0", 1.0, at=None), line("a#0", 0.0, at=None), line("a#0", 1.0, at=None)])
    assert ingest_side_table([str(path)], store, kind="rewards").rows == 3
    os.utime(path, (time.time() - 10, time.time() - 10))  # new identity, same bytes: nothing past the point
    again = ingest_side_table([str(path)], store, kind="rewards")
    assert (again.rows, again.already_present, again.bytes_read) == (0, 0, 0)
    assert again.resumed_from == {str(path): path.stat().st_size}
    with open(path, "a") as fh:
        fh.write(line("a#0", 1.0, at=None) + "\n")  # a third A: a new occurrence
    assert ingest_side_table([str(path)], store, kind="rewards").rows == 1
    assert rewards(store) == [("a#0", "reward", 0.0)] + [("a#0", "reward", 1.0)] * 3


def test_a_rotated_reference_file_adds_its_new_rows(store, tmp_path):
    path = tmp_path / "ref.jsonl"

    def ref(sample_id: str, lps: list[float]) -> str:
        return json.dumps({"sample_id": sample_id, "ref_model": "base", "ref_logprobs": lps})

    write(path, [ref("a#0", [-0.5]), ref("b#0", [-1.0])], mtime_s=time.time() - 3600)
    assert ingest_side_table([str(path)], store, kind="ref").rows == 2
    write(path, [ref("c#0", [-2.0]), ref("a#0", [-0.5]), ref("a#0", [-0.25])])  # a#0 re-scored: a new row
    rotated = ingest_side_table([str(path)], store, kind="ref")
    assert (rotated.rows, rotated.already_present) == (2, 1)
    df = pl.read_delta(store.table_uri("ref_logprobs")).sort("sample_id", "source_line")
    assert df.select("sample_id", "ref_logprobs").rows() == [
        ("a#0", [-0.5]),
        ("a#0", [-0.25]),
        ("b#0", [-1.0]),
        ("c#0", [-2.0]),
    ]


def test_rewards_committed_before_a_kill_are_found_from_the_log(store, tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    write(path, [line("a#0", 1.0)], mtime_s=time.time() - 3600)

    def killed(self, version, rows):
        raise KeyboardInterrupt  # dies between the rewards commit and its index commit

    monkeypatch.setattr(SampleIndex, "committed", killed)
    with pytest.raises(KeyboardInterrupt):
        ingest_side_table([str(path)], store, kind="rewards")
    monkeypatch.undo()
    assert store.open(EVENT_INDEXES["rewards"].index_table) is None
    write(path, [line("b#0", 0.0), line("a#0", 1.0)])  # rotated meanwhile
    again = ingest_side_table([str(path)], store, kind="rewards")
    assert (again.rows, again.already_present) == (1, 1)
    assert store.read(EVENT_INDEXES["rewards"].index_table).num_rows == 2


def test_a_rewards_line_still_being_written_is_left_for_the_next_run(store, tmp_path):
    path = tmp_path / "r.jsonl"
    full = line("b#0", 0.5)
    path.write_text(line("a#0", 1.0) + "\n" + full[:12])
    first = ingest_side_table([str(path)], store, kind="rewards")
    assert (first.rows, first.held_back_bytes, first.quarantined) == (1, 12, {})
    with open(path, "a") as fh:
        fh.write(full[12:] + "\n")
    done = ingest_side_table([str(path)], store, kind="rewards")
    assert (done.rows, done.already_present, done.held_back_bytes, done.quarantined) == (1, 0, 0, {})
    assert done.resumed_from == {str(path): len(line("a#0", 1.0)) + 1}  # the finished line alone is read
    assert ingest_side_table([str(path)], store, kind="rewards").unchanged_files == 1
    stopped = tmp_path / "stopped.jsonl"
    write(stopped, [line("c#0", 0.0)])
    with open(stopped, "a") as fh:
        fh.write(full[:12])
    os.utime(stopped, (time.time() - 301, time.time() - 301))
    result = ingest_side_table([str(stopped)], store, kind="rewards")
    assert (result.rows, result.quarantined) == (1, {"truncated_line": 1})
    assert rewards(store) == [("a#0", "reward", 1.0), ("b#0", "reward", 0.5), ("c#0", "reward", 0.0)]


def test_inline_rewards_carry_the_id_a_rewards_file_gives_the_same_event(store, tmp_path):
    trace = tmp_path / "rollouts.jsonl"
    trace.write_bytes((FIXTURES / "nemo_gym/rollouts.jsonl").read_bytes())
    ingest([str(trace)], store)
    (inline,) = pl.read_delta(store.table_uri("rewards")).rows(named=True)
    sample_id = "resp_071791a86d9d4180a2d514b9d6606a3e/0#0"
    assert (inline["sample_id"], inline["value"]) == (sample_id, 0.0)
    assert inline["created_at"].timestamp() == 1775583409.0  # the rollout's own time
    assert inline["event_id"] == reward_id(sample_id, "reward", 0.0, 1775583409000)
    event = {"sample_id": sample_id, "reward": 0.0, "created_at": 1775583409}
    same = tmp_path / "r.jsonl"
    write(same, [json.dumps(event)])
    result = ingest_side_table([str(same)], store, kind="rewards")
    assert (result.rows, result.already_present) == (0, 1)


def test_a_rewritten_traces_file_is_read_for_what_it_holds_now(store, tmp_path):
    """Traces are recognised by sample id and digest, and a changed file (new size or mtime) is read again
    from its start: the ledger's ``bytes_consumed`` of a file still being written never skips new content."""
    path = tmp_path / "live.jsonl"
    recs = [json.dumps(vllm_chat(f"r{i}", [i + 1], [([i + 2], [-1.0])])) for i in range(5)]
    path.write_text(recs[0] + "\n" + recs[1] + "\n" + recs[2][:30])  # still being written
    first = ingest([str(path)], store)
    assert (first.samples, first.files[0].held_back_bytes) == (2, 30)
    path.write_text(recs[3] + "\n" + recs[4] + "\n")  # rotated before the line was finished: new content
    rotated = ingest([str(path)], store)
    assert (rotated.samples, rotated.already_present, rotated.quarantined) == (2, 0, {})
    path.write_text(recs[1] + "\n" + recs[2] + "\n" + recs[4] + "\n")  # rewritten once more, complete
    again = ingest([str(path)], store)
    assert (again.samples, again.already_present, again.quarantined) == (1, 2, {})
    ids = sorted(pl.read_delta(store.table_uri("traces"))["sample_id"].to_list())
    assert ids == [f"r{i}#0" for i in range(5)]


def test_columnar_reward_ids_are_the_row_by_row_ids():
    """A columnar block's ids (:func:`reward_ids`) are the ids the row path gives the same events, duplicates
    counted in file order across batches, the time in the content only where the source gave it."""
    rows = [
        ("a#0", "reward", 1.0, 1_790_000_000_000),
        ("b#0", "format", -0.0, 5),
        ("a#0", "reward", 1.0, 1_790_000_000_000),
    ]
    stamped = [True, False, True]
    n = len(rows)
    cols = {
        "sample_id": pa.array([r[0] for r in rows]),
        "name": pa.array([r[1] for r in rows]),
        "value": pa.array([r[2] for r in rows], pa.float64()),
        "created_at": pa.array([r[3] * 1000 for r in rows]).cast(REWARDS.field("created_at").type),
    }
    batch = pa.RecordBatch.from_pydict({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in REWARDS}, schema=REWARDS)
    contents = [
        reward_content(sid, name, value, ms * 1000 if given else None)
        for (sid, name, value, ms), given in zip(rows, stamped, strict=True)
    ]
    assert reward_contents(batch, stamped) == contents
    by_row = Occurrences()
    expected = by_row.ids(contents) + by_row.ids(contents)
    columnar = Occurrences()
    got = reward_ids(batch, stamped, columnar).to_pylist() + reward_ids(batch, stamped, columnar).to_pylist()
    assert got == expected
    assert len(set(got)) == 6 and got[0] == reward_id("a#0", "reward", 1.0, 1_790_000_000_000_000)
