"""A build says how many of its drops an earlier build dropped too: a run with nothing new drops the same samples
again, and that is not news."""

from __future__ import annotations

from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.store.tables import Store
from tests.shards_fixtures import commit_traces, grouped_rows


def test_drops_of_samples_dropped_before_are_counted_apart(tmp_path):
    store = Store(str(tmp_path / "s"))
    out = str(tmp_path / "o")
    first_rows = grouped_rows("a", 2, 2)
    commit_traces(store, first_rows, rewarded=[r["sample_id"] for r in first_rows[:3]], refs=False)
    first = build_shards(store, out)
    assert (first.status, first.drops, first.dropped_before) == ("built", {"missing_reward": 1}, 0)
    assert first.headline().endswith(", 1 dropped → " + str(first.set_id))

    again = build_shards(store, out)
    assert (again.status, again.drops, again.dropped_before) == ("nothing_new", {"missing_reward": 1}, 1)
    assert again.headline() == (
        "build-shards nothing_new: 0 samples, 0 tokens in 0 shards, 1 dropped (all dropped by an earlier build too)"
    )

    new_rows = grouped_rows("b", 2, 2)
    commit_traces(store, new_rows, rewarded=[r["sample_id"] for r in new_rows[:2]], refs=False)
    third = build_shards(store, out)
    assert (third.status, third.drops, third.dropped_before) == ("built", {"missing_reward": 3}, 1)
    assert "3 dropped (1 of them by an earlier build too)" in third.headline()
    assert third.to_json()["dropped_before"] == 1


def test_a_rebuild_scans_everything_and_does_not_know_which_drops_are_old(tmp_path):
    store = Store(str(tmp_path / "s"))
    rows = grouped_rows("a", 1, 2)
    commit_traces(store, rows, rewarded=[rows[0]["sample_id"]], refs=False)
    first = build_shards(store, str(tmp_path / "o"))
    assert first.dropped_before == 0  # the first build into OUT
    rebuilt = build_shards(store, str(tmp_path / "o"), options=ShardOptions(), rebuild=True)
    assert (rebuilt.drops, rebuilt.dropped_before) == ({"missing_reward": 1}, None)
    assert rebuilt.headline().endswith(", 1 dropped → " + str(rebuilt.set_id))
