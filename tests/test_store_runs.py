"""One run's views of the store's tables (``Store.one_run``, ``Store.latest``) and the one-pass txn reader."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction

from prl.errors import LockedError
from prl.schema import REWARDS
from prl.store.locks import holding, running
from prl.store.tables import Store
from prl.store.txns import transactions
from tests.shards_fixtures import reward, table


def _rewards(*ids: str) -> list[pa.RecordBatch]:
    return table(REWARDS, [reward(i, 1.0) for i in ids]).to_batches()


def test_latest_in_a_run_sees_another_writers_commit_and_refresh_false_keeps_the_view(tmp_path):
    store, other = Store(str(tmp_path / "s")), Store(str(tmp_path / "s"))
    store.commit("rewards", _rewards("a:0"))
    with store.one_run():
        kept = store.latest("rewards")
        assert kept is not None and kept.version() == 1
        other.commit("rewards", _rewards("b:0"))
        assert store.latest("rewards", refresh=False) is kept and kept.version() == 1
        assert store.latest("rewards") is kept and kept.version() == 2  # brought up to date, not reopened
        assert sorted(store.read("rewards")["sample_id"].to_pylist()) == ["a:0", "b:0"]
    assert store.latest("rewards") is not kept  # outside a run: a fresh open each time


def test_a_step_runs_holding_its_lock_and_keeping_its_tables(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.commit("rewards", _rewards("a:0"))
    with running(store, "ingest") as lock:
        assert lock is not None and lock.step == "ingest"
        kept = store.latest("rewards")
        assert kept is not None and store.latest("rewards", refresh=False) is kept
        with pytest.raises(LockedError), holding(store.uri, "ingest"):
            pass
    assert store.latest("rewards") is not kept
    with holding(store.uri, "ingest"):  # released when the step ends
        pass
    with running(store, "ingest", enabled=False) as lock:  # a dry run: no lock, the same run view
        assert lock is None and store.latest("rewards") is store.latest("rewards", refresh=False)


def test_a_commit_on_a_kept_view_behind_other_writers_lands_after_them_with_its_own_version(tmp_path):
    store, other = Store(str(tmp_path / "s")), Store(str(tmp_path / "s"))
    store.commit("rewards", _rewards("a:0"))
    with store.one_run():
        assert store.commit("rewards", _rewards("b:0")).version == 2  # one version past the view: this commit
        other.commit("rewards", _rewards("c:0"))
        other.commit("rewards", _rewards("d:0"))
        assert store.latest("rewards", refresh=False).version() == 2
        result = store.commit("rewards", _rewards("e:0"))  # made against version 2, lands at 5
        assert result.version == 5 and store.version_seen("rewards") == 5
    assert sorted(store.read("rewards", version=4)["sample_id"].to_pylist()) == ["a:0", "b:0", "c:0", "d:0"]
    assert sorted(store.read("rewards", version=5)["sample_id"].to_pylist()) == ["a:0", "b:0", "c:0", "d:0", "e:0"]


def test_runs_nest_each_with_its_own_views(tmp_path):
    store, other = Store(str(tmp_path / "s")), Store(str(tmp_path / "s"))
    store.commit("rewards", _rewards("a:0"))
    with store.one_run():
        outer = store.latest("rewards")
        other.commit("rewards", _rewards("b:0"))
        with store.one_run():
            inner = store.latest("rewards", refresh=False)
            assert inner is not outer and inner.version() == 2
        assert store.latest("rewards", refresh=False) is outer and outer.version() == 1


def _commit_txns(uri: str, txns: dict[str, int]) -> None:
    props = CommitProperties(app_transactions=[Transaction(app, version) for app, version in txns.items()])
    DeltaTable(uri).create_write_transaction([], "append", REWARDS, commit_properties=props)


@pytest.mark.parametrize("checkpoint", [None, 2, 4])
def test_the_one_pass_txn_reader_answers_as_delta_rs_does(tmp_path, checkpoint):
    store = Store(str(tmp_path / "s"))
    store.ensure("rewards")
    uri = store.table_uri("rewards")
    steps = [{"a": 1, "b": 1}, {"a": 2}, {"c": 7}, {"b": 3, "d": 1}, {"a": 9}]
    for version, txns in enumerate(steps, start=1):
        _commit_txns(uri, txns)
        if version == checkpoint:
            DeltaTable(uri).create_checkpoint()
    opened = DeltaTable(uri)
    found = transactions(store, "rewards", opened)
    assert found.versions == {"a": 9, "b": 3, "c": 7, "d": 1}  # read from the log, not asked of delta-rs
    assert found.table_version == 5
    for app in ("a", "b", "c", "d", "never"):
        assert found.lookup(app) == opened.transaction_version(app)


def test_the_txn_reader_leaves_a_checkpoint_newer_than_the_snapshot_to_delta_rs(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.ensure("rewards")
    uri = store.table_uri("rewards")
    _commit_txns(uri, {"a": 1})
    opened = DeltaTable(uri)  # version 1
    _commit_txns(uri, {"a": 2})
    DeltaTable(uri).create_checkpoint()  # at version 2, past the snapshot
    found = transactions(store, "rewards", opened)
    assert found.versions is None and found.lookup("a") == 1 == opened.transaction_version("a")
    assert transactions(store, "rewards", None).lookup("a") is None


@pytest.mark.parametrize("damage", ["last_checkpoint", "checkpoint_without_txn"])
def test_the_txn_reader_leaves_a_log_it_cannot_read_to_delta_rs(tmp_path, damage):
    store = Store(str(tmp_path / "s"))
    store.ensure("rewards")
    uri = store.table_uri("rewards")
    _commit_txns(uri, {"a": 1})
    _commit_txns(uri, {"a": 2})
    DeltaTable(uri).create_checkpoint()
    opened = DeltaTable(uri)
    log = tmp_path / "s" / "rewards" / "_delta_log"
    if damage == "last_checkpoint":
        (log / "_last_checkpoint").write_text("{not json")
    else:
        path = log / f"{2:020d}.checkpoint.parquet"
        pq.write_table(pq.read_table(path).drop_columns(["txn"]), path)
    found = transactions(store, "rewards", opened)
    assert found.versions is None and found.table_version == 2


def test_read_at_reads_the_pinned_snapshot_under_its_lock(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.ensure("rewards")
    version = store.version("rewards")
    assert version is not None
    seen = store.read_at("rewards", version, lambda table: (table.version(), store._pinned_lock.locked()))
    assert seen == (version, True) and not store._pinned_lock.locked()
    assert store.read_at("checks", 0, lambda table: table.version()) is None  # no such table yet
