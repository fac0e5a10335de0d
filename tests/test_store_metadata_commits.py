"""A commit made against a table view older than another writer's metadata commit (``prl maintain`` setting a
table property, another prl adding a nullable column) lands after it, instead of failing the run with exit 5."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from prl.errors import RetryableIOError
from prl.schema import REWARDS
from prl.store import writer
from prl.store.tables import Store
from tests.shards_fixtures import reward, table


def _rewards(*ids: str) -> list:
    return table(REWARDS, [reward(i, 1.0) for i in ids]).to_batches()


def test_a_commit_after_another_writers_property_commit_lands_once(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    store.commit("rewards", _rewards("a"))
    with store.one_run():
        pending = store.write_files("rewards", _rewards("b", "c"))  # the run's kept view: version 1
        DeltaTable(store.table_uri("rewards")).alter.set_table_properties({"delta.checkpointInterval": "7"})
        result = pending.commit({"operation": "test"})
    assert result.version == 3  # 0 create, 1 "a", 2 the property, 3 this commit
    fresh = DeltaTable(store.table_uri("rewards"))
    assert fresh.version() == 3
    assert fresh.metadata().configuration["delta.checkpointInterval"] == "7"
    ids = pl.from_arrow(store.read("rewards"))["sample_id"].sort().to_list()  # type: ignore[union-attr]
    assert ids == ["a", "b", "c"]


def test_a_second_metadata_change_is_exit_5_with_nothing_committed(tmp_path: Path, monkeypatch) -> None:
    """The commit is made once more, not again and again: a table whose metadata keeps changing is a retryable
    error (exit 5) and the files stay uncommitted."""
    store = Store(str(tmp_path / "store"))
    store.commit("rewards", _rewards("a"))
    calls: list[int] = []

    def refuse(self: DeltaTable, *args, **kwargs) -> None:
        calls.append(self.version())
        raise CommitFailedError(f"Failed to commit transaction: {writer.METADATA_CHANGED}.")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", refuse)
    pending = store.write_files("rewards", _rewards("b"))
    with pytest.raises(RetryableIOError, match="Metadata changed since last commit"):
        pending.commit()
    assert calls == [1, 1]  # tried twice, against the view brought up to date (nothing newer here)
    assert DeltaTable(store.table_uri("rewards")).version() == 1


def test_metadata_changed_since_checks_the_columns(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    store.commit("rewards", _rewards("a"))
    view = DeltaTable(store.table_uri("rewards"))
    pending = writer.PendingCommit(store, "rewards")
    other = CommitFailedError("Failed to commit transaction: a concurrent transaction conflicts")
    assert not pending._metadata_changed_since(view, other)
    DeltaTable(store.table_uri("rewards")).alter.set_table_properties({"delta.checkpointInterval": "7"})
    changed = CommitFailedError(f"Failed to commit transaction: {writer.METADATA_CHANGED}.")
    assert pending._metadata_changed_since(view, changed)
    assert view.version() == 2  # brought up to date
    with_extra = writer.TABLES["rewards"].append(pa.field("added_later", pa.int64()))
    with pytest.MonkeyPatch.context() as patched:  # a column this table's files need is not in the table
        patched.setitem(writer.TABLES, "rewards", with_extra)
        assert not pending._metadata_changed_since(view, changed)


def test_a_commit_that_landed_before_a_metadata_commit_refused_its_next_try_is_not_made_twice(
    tmp_path: Path, monkeypatch
) -> None:
    """A commit whose answer was lost lands; delta-rs tries it again at the next version, meets another
    writer's metadata commit there and raises "Metadata changed": the commit is found in the log, not made
    again (its rows would be there twice)."""
    store = Store(str(tmp_path / "store"))
    store.commit("rewards", _rewards("a"))
    real = DeltaTable.create_write_transaction

    def landed_then_refused(self: DeltaTable, *args, **kwargs) -> None:
        real(self, *args, **kwargs)
        DeltaTable(store.table_uri("rewards")).alter.set_table_properties({"delta.checkpointInterval": "7"})
        raise CommitFailedError(f"Failed to commit transaction: {writer.METADATA_CHANGED}.")

    pending = store.write_files("rewards", _rewards("b"))
    monkeypatch.setattr(DeltaTable, "create_write_transaction", landed_then_refused)
    result = pending.commit()
    assert result.version == 2  # 0 create, 1 "a", 2 this commit, 3 the property
    assert DeltaTable(store.table_uri("rewards")).version() == 3
    ids = pl.from_arrow(store.read("rewards"))["sample_id"].sort().to_list()  # type: ignore[union-attr]
    assert ids == ["a", "b"]
