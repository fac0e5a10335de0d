"""A build in turns (prl/shards/turns.py): at most ``max_set_samples`` traces rows per set, the rest pending in
the frontier, each set what a cron run that had seen only those files would have built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import prl.shards.build as build_module
from prl.errors import UsageError
from prl.shards.build import build_shards
from prl.shards.frontier import read_frontier
from prl.shards.layout import meta_root
from prl.shards.manifest import SAMPLES_FILE
from prl.shards.options import ShardOptions
from prl.shards.turns import newest_version, take
from prl.shards.verify import verify_shards
from prl.shards.writer import read_ipc
from prl.store.changes import snapshot_files, snapshot_turn_files
from prl.store.tables import Store
from tests.shards_fixtures import commit_traces, grouped_rows

OPTIONS = ShardOptions(kl="column", max_staleness=2, target_tokens=40, seed=3, max_set_samples=None)


def _store(tmp_path, commits: int = 4) -> Store:
    """``commits`` traces files of two groups of two samples each (c<i>…), all rewarded and checked."""
    store = Store(str(tmp_path / "store"))
    for i in range(commits):
        commit_traces(store, grouped_rows(f"c{i}", 2, 2))
    return store


def _shipped(out: str, set_ids: list[str]) -> list[list[str]]:
    """The sample ids each set shipped, sorted within the set."""
    return [
        sorted(read_ipc(f"{meta_root(out)}/sets/{s}/{SAMPLES_FILE}").column("sample_id").to_pylist()) for s in set_ids
    ]


def test_a_build_over_more_than_the_cap_publishes_a_set_per_turn(tmp_path):
    store = _store(tmp_path)
    out = str(tmp_path / "out")
    res = build_shards(store, out, options=OPTIONS.replace(max_set_samples=6))  # 4 rows a file: one file a turn
    assert (res.status, res.rows, len(res.sets), res.considered, res.already_shipped) == ("built", 16, 4, 16, 0)
    assert [s["rows"] for s in res.sets] == [4, 4, 4, 4]
    assert res.traces_scan == {"from": "whole", "rows": 16}
    assert res.set_id == res.sets[-1]["set_id"]
    shipped = _shipped(out, [s["set_id"] for s in res.sets])
    assert shipped == [sorted(f"c{i}{g}-{k}:0" for g in range(2) for k in range(2)) for i in range(4)]
    frontier = read_frontier(out)
    assert (
        frontier is not None
        and frontier.pending == ()
        and sorted(frontier.sets) == sorted(s["set_id"] for s in res.sets)
    )
    body = res.to_json()
    assert (
        body["headline"] == f"build-shards built: 16 samples, 96 tokens in 4 shards of 4 sets, 0 dropped → {res.set_id}"
    )
    assert [s["set_id"] for s in body["sets"]] == [s["set_id"] for s in res.sets]
    assert verify_shards(out).exit_code == 0
    again = build_shards(store, out, options=OPTIONS.replace(max_set_samples=6))
    assert (again.status, again.rows, again.sets, again.traces_scan) == (
        "nothing_new",
        0,
        [],
        {"from": "frontier", "rows": 0},
    )


def test_a_turn_takes_files_up_to_the_cap_and_at_least_one(tmp_path):
    store = _store(tmp_path)
    two = build_shards(store, str(tmp_path / "two"), options=OPTIONS.replace(max_set_samples=8))
    assert [s["rows"] for s in two.sets] == [8, 8]
    one = build_shards(store, str(tmp_path / "one"), options=OPTIONS.replace(max_set_samples=1))
    assert [s["rows"] for s in one.sets] == [4, 4, 4, 4]  # a file is never split
    whole = build_shards(store, str(tmp_path / "whole"), options=OPTIONS.replace(max_set_samples=16))
    assert (len(whole.sets), whole.rows, whole.traces_scan) == (1, 16, {"from": "whole", "rows": 16})


def test_each_set_is_what_a_cron_run_that_saw_only_its_files_would_build(tmp_path):
    """Turn by turn, the shards are the bytes of a build run after each commit (no cap)."""
    turns = _store(tmp_path / "a")
    res = build_shards(turns, str(tmp_path / "turns"), options=OPTIONS.replace(max_set_samples=4))
    cron = Store(str(tmp_path / "b" / "store"))
    runs = []
    for i in range(4):
        commit_traces(cron, grouped_rows(f"c{i}", 2, 2))
        runs.append(build_shards(cron, str(tmp_path / "cron"), options=OPTIONS))
    assert len({s["set_id"] for s in res.sets}) == 4
    turn_shards = [[e["sha256"] for e in json.loads(Path(s["manifest_path"]).read_text())["shards"]] for s in res.sets]
    assert turn_shards == [[e["sha256"] for e in r.shards] for r in runs]


def test_staleness_counts_the_newest_version_of_files_still_pending(tmp_path):
    """The first turn reads only step-7 rows, yet they are stale against step 10 (in a later file), as in one
    build of everything."""
    store = Store(str(tmp_path / "store"))
    commit_traces(store, grouped_rows("old", 2, 2, version="step-7"))
    commit_traces(store, grouped_rows("new", 2, 2, version="step-10"))
    capped = build_shards(store, str(tmp_path / "capped"), options=OPTIONS.replace(max_set_samples=4))
    whole = build_shards(store, str(tmp_path / "whole"), options=OPTIONS)
    assert (capped.rows, capped.drops, capped.considered) == (whole.rows, whole.drops, whole.considered)
    assert (capped.rows, capped.drops, capped.considered, len(capped.sets)) == (4, {"stale": 4}, 8, 1)
    frontier = read_frontier(str(tmp_path / "capped"))
    assert frontier is not None and (frontier.version_max, frontier.pending) == (10, ())


def test_rows_dropped_in_a_turn_are_reconsidered_with_the_next_and_count_against_its_cap(tmp_path):
    """A group whose second sample is unrewarded ships its first sample alone; the unrewarded one waits in the
    backlog: with a cap of 5 it fills the next turn's budget beside one file."""
    store = Store(str(tmp_path / "store"))
    commit_traces(store, grouped_rows("a", 2, 2), rewarded=["a0-0:0", "a1-0:0", "a1-1:0"])
    commit_traces(store, grouped_rows("b", 1, 2))
    commit_traces(store, grouped_rows("c", 1, 2))
    out = str(tmp_path / "out")
    res = build_shards(store, out, options=OPTIONS.replace(max_set_samples=5))
    assert [s["rows"] for s in res.sets] == [3, 4]  # turn 1: file a; turn 2: a0-1 (backlog) + files b and c
    assert (res.rows, res.considered, res.already_shipped, res.drops) == (7, 8, 0, {"missing_reward": 1})
    assert res.traces_scan == {"from": "whole", "rows": 4 + 1 + 4}
    frontier = read_frontier(out)
    assert frontier is not None and frontier.pending == ()
    backlog = read_ipc(f"{meta_root(out)}/frontier/{frontier.backlog}")
    assert backlog.column("sample_id").to_pylist() == ["a0-1:0"]


def test_a_build_killed_between_turns_goes_on_from_the_pending_files(tmp_path, monkeypatch):
    store = _store(tmp_path)
    out, options = str(tmp_path / "out"), OPTIONS.replace(max_set_samples=4)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # what a signal between two turns does

    monkeypatch.setattr(build_module, "continued_source", killed)
    with pytest.raises(KeyboardInterrupt):
        build_shards(store, out, options=options)
    frontier = read_frontier(out)
    assert frontier is not None and len(frontier.pending) == 3 and len(frontier.sets) == 1
    monkeypatch.undo()
    rest = build_shards(store, out, options=options)
    assert (len(rest.sets), rest.rows, rest.already_shipped, rest.traces_scan["from"]) == (3, 12, 4, "frontier")
    every = _shipped(out, [*frontier.sets, *(s["set_id"] for s in rest.sets)])
    flat = [s for ids in every for s in ids]
    assert len(flat) == len(set(flat)) == 16
    assert verify_shards(out).exit_code == 0


def test_a_rebuild_in_turns_replaces_every_set_and_ships_each_sample_once(tmp_path):
    store = _store(tmp_path)
    out = str(tmp_path / "out")
    first = build_shards(store, out, options=OPTIONS)
    res = build_shards(store, out, options=OPTIONS.replace(max_set_samples=8), rebuild=True)
    assert [s["rows"] for s in res.sets] == [8, 8]
    index = json.loads(Path(meta_root(out), "index.json").read_text())
    assert first.set_id not in json.dumps(index)
    flat = [s for ids in _shipped(out, [s["set_id"] for s in res.sets]) for s in ids]
    assert sorted(flat) == sorted(set(flat)) and len(flat) == 16
    assert verify_shards(out).exit_code == 0


def test_a_dry_run_plans_the_first_turn_and_counts_the_files_left(tmp_path):
    store = _store(tmp_path)
    out = str(tmp_path / "out")
    res = build_shards(store, out, options=OPTIONS.replace(max_set_samples=8), dry_run=True)
    assert (res.status, res.rows, res.pending_files, res.to_json()["pending_files"]) == ("dry_run", 8, 2, 2)
    assert read_frontier(out) is None


def test_files_are_counted_from_the_log_or_their_footers(tmp_path):
    store = _store(tmp_path, commits=3)
    version = store.versions()["traces"]
    assert version is not None
    files, known = snapshot_turn_files(store, version)
    assert sorted(files) == sorted(snapshot_files(store, "traces", version)) and len(files) == 3
    assert known == dict.fromkeys(files, 4)
    first = pq.read_table(f"{store.table_path('traces')}/{files[0]}").column("sample_id").to_pylist()
    assert first == ["c00-0:0", "c00-1:0", "c01-0:0", "c01-1:0"]  # oldest first
    assert take(store, files, known, 8) == (files[:2], files[2:])
    assert take(store, files, {}, 8) == (files[:2], files[2:])  # from the footers
    assert take(store, files, {}, 3) == (files[:1], files[1:])
    assert take(store, files, known, None) == (files, [])
    assert take(store, [], known, 3) == ([], [])
    assert newest_version(store, files) == 10


@pytest.mark.parametrize("value", [0, -3, "many", True, 2.5])
def test_max_set_samples_must_be_a_positive_count(value):
    with pytest.raises(UsageError, match="max_set_samples"):
        ShardOptions(max_set_samples=value)


@pytest.mark.parametrize(("value", "cap"), [("none", None), ("None", None), (None, None), ("12", 12), (7, 7)])
def test_max_set_samples_none_is_one_set(value, cap):
    assert ShardOptions.from_mapping({"max_set_samples": value}).max_set_samples == cap
    assert ShardOptions().max_set_samples == 50_000


def test_a_rebuild_whose_first_turn_ships_nothing_still_replaces_the_old_sets(tmp_path):
    store = Store(str(tmp_path / "store"))
    commit_traces(store, grouped_rows("u", 2, 2), rewarded=[])  # the oldest file: nothing of it can ship
    commit_traces(store, grouped_rows("c1", 2, 2))
    commit_traces(store, grouped_rows("c2", 2, 2))
    out = str(tmp_path / "out")
    old = build_shards(store, out, options=OPTIONS)
    res = build_shards(store, out, options=OPTIONS.replace(max_set_samples=4), rebuild=True)
    assert (res.status, res.rows, [s["rows"] for s in res.sets]) == ("built", 8, [4, 4])
    assert res.drops == {"missing_reward": 4}
    current = sorted(p.name for p in Path(out).iterdir() if not p.name.startswith("."))
    assert old.set_id not in current and current == sorted(s["set_id"] for s in res.sets)
    assert verify_shards(out).exit_code == 0


def test_a_set_left_out_by_id_and_gone_between_turns_means_a_whole_scan(tmp_path, monkeypatch):
    """Turns over an OUT whose set the frontier does not account for leave its samples out by id; a build
    killed between turns records it as excluded, and once it is gone its samples are considered again."""
    store = Store(str(tmp_path / "store"))
    commit_traces(store, grouped_rows("c0", 2, 2))
    out = str(tmp_path / "out")
    first = build_shards(store, out, options=OPTIONS.replace(seed=9))  # other options: its frontier does not apply
    commit_traces(store, grouped_rows("c1", 2, 2))
    commit_traces(store, grouped_rows("c2", 2, 2))
    options = OPTIONS.replace(max_set_samples=4)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_module, "continued_source", killed)
    with pytest.raises(KeyboardInterrupt):
        build_shards(store, out, options=options)  # turn 1: the c0 file, every sample already shipped
    frontier = read_frontier(out)
    assert frontier is not None and (frontier.sets, frontier.excluded, len(frontier.pending)) == (
        (),
        (first.set_id,),
        2,
    )
    monkeypatch.undo()
    shutil.rmtree(Path(out, first.set_id))
    shutil.rmtree(Path(meta_root(out), "sets", first.set_id))
    res = build_shards(store, out, options=options)
    assert (res.traces_scan["from"], res.rows, [s["rows"] for s in res.sets]) == ("whole", 12, [4, 4, 4])


@pytest.mark.parametrize("damage", ["pending_gone", "pending_not_a_list", "excluded_missing"])
def test_a_frontier_whose_pending_files_cannot_be_followed_is_a_whole_scan(tmp_path, monkeypatch, damage):
    store = _store(tmp_path, commits=3)
    out, options = str(tmp_path / "out"), OPTIONS.replace(max_set_samples=4)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_module, "continued_source", killed)
    with pytest.raises(KeyboardInterrupt):
        build_shards(store, out, options=options)  # one set, two files pending
    monkeypatch.undo()
    path = Path(meta_root(out), "frontier.json")
    raw = json.loads(path.read_text())
    assert len(raw["pending"]) == 2
    if damage == "pending_gone":
        raw["pending"][0] = "part-00000-not-in-the-snapshot.parquet"
    elif damage == "pending_not_a_list":
        raw["pending"] = raw["pending"][0]
    else:
        del raw["excluded"]
    path.write_text(json.dumps(raw))
    res = build_shards(store, out, options=options)
    assert (res.traces_scan["from"], res.rows, [s["rows"] for s in res.sets]) == ("whole", 8, [4, 4])
    assert verify_shards(out).exit_code == 0  # the first set's samples left out by id: nothing twice
