"""The build frontier (prl/shards/frontier.py): a build reads the last build's backlog and new traces files only,
and publishes the same bytes as a build that scans the whole table."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from prl.maintain import maintain
from prl.schema import REWARDS
from prl.shards.build import build_shards
from prl.shards.frontier import frontier_path, read_frontier
from prl.shards.layout import meta_root
from prl.shards.options import ShardOptions
from prl.shards.verify import verify_shards
from prl.shards.writer import read_ipc
from prl.store.changes import snapshot_files
from prl.store.tables import Store
from tests.shards_fixtures import commit_traces, grouped_rows, reward, table

OPTIONS = ShardOptions(kl="column", max_staleness=2, target_tokens=40, seed=3)


def _history(store: Store) -> None:
    """Commit 1: two groups that all ship. Commit 2: a group with one sample lacking its reward, and a group
    at step 7 (stale at current step 10, max_staleness 2)."""
    commit_traces(store, grouped_rows("h", 2, 2))
    backlog = grouped_rows("b", 1, 2) + grouped_rows("s", 1, 2, version="step-7")
    commit_traces(store, backlog, rewarded=["b0-0:0", "s0-0:0", "s0-1:0"])


def _shards(res) -> list[tuple[str, str, int]]:
    return [(s["file"], s["sha256"], s["rows"]) for s in res.shards]


def _same_build(a, b) -> None:
    assert (a.status, a.set_id, _shards(a)) == (b.status, b.set_id, _shards(b))
    assert (a.considered, a.already_shipped, a.drops) == (b.considered, b.already_shipped, b.drops)
    assert a.statistics == b.statistics


def test_a_frontier_build_reads_backlog_and_new_files_and_ships_the_same_bytes(tmp_path):
    store = Store(str(tmp_path / "store"))
    _history(store)
    fast, whole = str(tmp_path / "fast"), str(tmp_path / "whole")
    first = build_shards(store, fast, options=OPTIONS)
    assert first.traces_scan == {"from": "whole", "rows": 8}
    assert (first.rows, first.drops) == (5, {"stale": 2, "missing_reward": 1})  # b0-0 ships alone
    _same_build(first, build_shards(store, whole, options=OPTIONS))
    frontier = read_frontier(fast)
    assert frontier is not None and (frontier.shipped, frontier.version_max) == (5, 10)
    backlog = read_ipc(os.path.join(meta_root(fast), "frontier", frontier.backlog))
    assert sorted(backlog.column("sample_id").to_pylist()) == ["b0-1:0", "s0-0:0", "s0-1:0"]

    # new rows at step 12 (the stale group stays stale), and the missing reward arrives
    commit_traces(store, grouped_rows("n", 1, 2, version="step-12"))
    store.commit("rewards", table(REWARDS, [reward("b0-1:0", 1.0)]).to_batches())
    os.remove(frontier_path(whole))  # this twin scans the whole table
    second = build_shards(store, fast, options=OPTIONS)
    assert second.traces_scan == {"from": "frontier", "rows": 3 + 2}
    twin = build_shards(store, whole, options=OPTIONS)
    assert twin.traces_scan == {"from": "whole", "rows": 10}
    _same_build(second, twin)
    assert (second.rows, second.considered, second.already_shipped, second.drops) == (3, 10, 5, {"stale": 2})
    again = build_shards(store, fast, options=OPTIONS)
    assert (again.status, again.traces_scan, again.drops) == (
        "nothing_new",
        {"from": "frontier", "rows": 2},
        {"stale": 2},
    )
    assert verify_shards(fast).exit_code == 0


def test_history_files_are_not_read(tmp_path):
    store = Store(str(tmp_path / "store"))
    commit_traces(store, grouped_rows("h", 2, 2))
    out = str(tmp_path / "out")
    assert build_shards(store, out, options=OPTIONS).rows == 4
    [old] = snapshot_files(store, "traces", store.versions()["traces"])
    shutil.move(f"{store.table_path('traces')}/{old}", str(tmp_path / "gone.parquet"))  # history, unreadable
    commit_traces(store, grouped_rows("n", 1, 2))
    res = build_shards(store, out, options=OPTIONS)
    assert (res.status, res.rows, res.traces_scan) == ("built", 2, {"from": "frontier", "rows": 2})


def test_a_set_published_after_the_frontier_was_written_is_left_out(tmp_path):
    """A build killed between publishing its set and writing the frontier: the next one finds the set and skips
    its samples (and still ships what a whole scan ships)."""
    store = Store(str(tmp_path / "store"))
    _history(store)
    fast, whole = str(tmp_path / "fast"), str(tmp_path / "whole")
    build_shards(store, fast, options=OPTIONS)
    build_shards(store, whole, options=OPTIONS)
    saved = {p: Path(p).read_bytes() for p in (frontier_path(fast),)}
    backlog_dir = Path(meta_root(fast), "frontier")
    kept = {p.name: p.read_bytes() for p in backlog_dir.iterdir()}
    commit_traces(store, grouped_rows("n", 1, 2, version="step-11"))
    assert build_shards(store, fast, options=OPTIONS).rows == 2
    for path, body in saved.items():  # back to the frontier written before that set
        Path(path).write_bytes(body)
    for name, body in kept.items():
        (backlog_dir / name).write_bytes(body)
    build_shards(store, whole, options=OPTIONS)
    commit_traces(store, grouped_rows("m", 1, 3, version="step-11"))
    os.remove(frontier_path(whole))
    res, twin = build_shards(store, fast, options=OPTIONS), build_shards(store, whole, options=OPTIONS)
    assert res.traces_scan == {"from": "frontier", "rows": 3 + 2 + 3}  # backlog, the set's rows again, new
    _same_build(res, twin)
    assert (res.rows, res.already_shipped) == (3, 7)
    assert verify_shards(fast).exit_code == 0  # nothing shipped twice


@pytest.mark.parametrize("change", ["options", "rebuild", "set_gone", "compacted", "garbled"])
def test_any_doubt_is_a_whole_scan(tmp_path, change):
    store = Store(str(tmp_path / "store"))
    _history(store)
    out = str(tmp_path / "out")
    first = build_shards(store, out, options=OPTIONS)
    options, rebuild = OPTIONS, False
    if change == "options":
        options = ShardOptions(kl="column", max_staleness=3, target_tokens=40, seed=3)
    elif change == "rebuild":
        rebuild = True
    elif change == "set_gone":
        shutil.rmtree(first.set_dir)
        shutil.rmtree(os.path.join(meta_root(out), "sets", first.set_id))
    elif change == "compacted":
        maintain(store, retention_hours=1)
    else:
        Path(frontier_path(out)).write_text(json.dumps({"format": 1, "traces_version": "x"}))
    res = build_shards(store, out, options=options, rebuild=rebuild)
    assert res.traces_scan == {"from": "whole", "rows": 8}
    after = read_frontier(out)
    assert after is not None and after.traces_version == store.versions()["traces"]
