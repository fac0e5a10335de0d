"""The Delta table properties prl creates its tables with (a checkpoint every 10 commits), and
``prl maintain --upgrade`` setting them on a table an older prl created."""

from __future__ import annotations

import json
import os

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from prl.ingestion.traces import ingest
from prl.maintain import maintain, upgrade
from prl.schema import REWARDS
from prl.store.index import INDEX_TABLE
from prl.store.tables import TABLE_PROPERTIES, Store
from tests.records import vllm_chat
from tests.shards_fixtures import reward, table


def _rewards(*ids: str) -> list[pa.RecordBatch]:
    return table(REWARDS, [reward(i, 1.0) for i in ids]).to_batches()


def _checkpoints(store: Store, name: str) -> list[int]:
    log = f"{store.table_path(name)}/_delta_log"
    return sorted(int(f.split(".")[0]) for f in os.listdir(log) if f.endswith(".checkpoint.parquet"))


def _last_checkpoint(store: Store, name: str) -> int:
    body = store.log_file(name, "_last_checkpoint")
    assert body is not None
    return int(json.loads(body)["version"])


def test_a_new_table_is_checkpointed_after_versions_9_and_19(store):
    for i in range(25):  # versions 1..25 after the creation at 0
        store.commit("rewards", _rewards(f"s{i}:0"))
    opened = store.open("rewards")
    assert opened is not None and opened.version() == 25
    assert opened.metadata().configuration == {"delta.checkpointInterval": "10"}
    assert _checkpoints(store, "rewards") == [9, 19]
    assert _last_checkpoint(store, "rewards") == 19
    assert store.read("rewards").num_rows == 25
    assert store.read("rewards", version=9).num_rows == 9  # a version read from its checkpoint


def test_the_sample_index_is_created_with_the_interval_too(store, write_trace):
    ingest([str(write_trace("a.jsonl", [vllm_chat("r0", [1], [([2], [-1.0])])]))], store)
    for name in ("traces", INDEX_TABLE):
        opened = store.open(name)
        assert opened is not None and opened.metadata().configuration == TABLE_PROPERTIES, name


def test_an_older_table_gets_the_interval_from_the_upgrade(store):
    write_deltalake(store.table_uri("rewards"), table(REWARDS, [reward("old:0", 0.5)]))  # as prl before
    old = store.open("rewards")
    assert old is not None and old.metadata().configuration == {}

    (done,) = upgrade(store).tables
    assert (done.table, done.properties_set, done.columns_added, done.event_ids_filled) == ("rewards", True, [], 1)
    upgraded = store.open("rewards")
    assert upgraded is not None and upgraded.metadata().configuration == TABLE_PROPERTIES
    assert upgraded.version() == 2  # the properties at 1, the row given its event id at 2
    assert upgrade(store).tables == []  # set once
    (maintained,) = maintain(store, retention_hours=1, tables=["rewards"]).tables
    assert (maintained.checkpointed, maintained.version_before, maintained.version_after) == (True, 2, 2)
    assert _checkpoints(store, "rewards") == [2]

    for i in range(10):  # versions 3..12: delta-rs checkpoints after version 9 from now on
        store.commit("rewards", _rewards(f"more{i}:0"))
    assert store.version("rewards") == 12
    assert _checkpoints(store, "rewards") == [2, 9]
    assert _last_checkpoint(store, "rewards") == 9
    assert store.read("rewards").num_rows == 11


def test_the_upgrade_keeps_an_interval_set_otherwise(store):
    write_deltalake(
        store.table_uri("rewards"),
        table(REWARDS, [reward("a:0", 1.0)]),
        configuration={"delta.checkpointInterval": "100", "delta.appendOnly": "false"},
    )
    (done,) = upgrade(store).tables
    assert done.properties_set is False
    opened = DeltaTable(store.table_uri("rewards"))
    assert opened.metadata().configuration == {"delta.checkpointInterval": "100", "delta.appendOnly": "false"}


def test_a_dry_run_upgrade_sets_no_property(store):
    write_deltalake(store.table_uri("rewards"), table(REWARDS, [reward("old:0", 0.5)]))  # as prl before
    result = upgrade(store, dry_run=True)
    assert (result.format_before, result.format_after) == (1, 1)
    (done,) = result.tables
    assert (done.properties_set, done.event_ids_filled, done.index_rebuilt) == (True, 1, False)
    opened = DeltaTable(store.table_uri("rewards"))
    assert (opened.version(), opened.metadata().configuration) == (0, {})
