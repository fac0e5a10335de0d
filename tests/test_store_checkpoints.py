"""The Delta table properties prl creates its tables with (a checkpoint every 10 commits), and ``prl maintain``
setting them on a table an older prl created."""

from __future__ import annotations

import json
import os

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from prl.ingestion.traces import ingest
from prl.schema import REWARDS
from prl.store.index import INDEX_TABLE
from prl.store.maintain import maintain
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


def test_an_older_table_reads_and_maintain_gives_it_the_interval(store):
    write_deltalake(store.table_uri("rewards"), table(REWARDS, [reward("old:0", 0.5)]))  # as prl before
    old = store.open("rewards")
    assert old is not None and old.metadata().configuration == {}
    store.commit("rewards", _rewards("new:0"))
    assert sorted(store.read("rewards")["sample_id"].to_pylist()) == ["new:0", "old:0"]
    assert store.version("rewards") == 1

    (done,) = maintain(store, retention_hours=1, tables=["rewards"]).tables
    # compaction commits version 2, the properties 3, and the checkpoint is written at 3
    assert (done.properties_set, done.checkpointed, done.version_before, done.version_after) == (True, True, 1, 3)
    assert _checkpoints(store, "rewards") == [3]
    upgraded = store.open("rewards")
    assert upgraded is not None and upgraded.metadata().configuration == TABLE_PROPERTIES
    assert sorted(store.read("rewards")["sample_id"].to_pylist()) == ["new:0", "old:0"]
    (again,) = maintain(store, retention_hours=1, tables=["rewards"]).tables
    assert again.properties_set is False  # set once

    for i in range(10):  # versions 4..13: delta-rs checkpoints after version 9 from now on
        store.commit("rewards", _rewards(f"more{i}:0"))
    assert store.version("rewards") == 13
    assert _checkpoints(store, "rewards") == [3, 9]
    assert _last_checkpoint(store, "rewards") == 9
    assert store.read("rewards").num_rows == 12


def test_maintain_keeps_an_interval_set_otherwise(store):
    write_deltalake(
        store.table_uri("rewards"),
        table(REWARDS, [reward("a:0", 1.0)]),
        configuration={"delta.checkpointInterval": "100", "delta.appendOnly": "false"},
    )
    (done,) = maintain(store, retention_hours=1, tables=["rewards"]).tables
    assert done.properties_set is False
    opened = DeltaTable(store.table_uri("rewards"))
    assert opened.metadata().configuration == {"delta.checkpointInterval": "100", "delta.appendOnly": "false"}


def test_a_dry_run_maintain_sets_no_property(store):
    write_deltalake(store.table_uri("rewards"), table(REWARDS, [reward("old:0", 0.5)]))  # as prl before
    (done,) = maintain(store, retention_hours=1, tables=["rewards"], dry_run=True).tables
    assert (done.properties_set, done.checkpointed) == (False, False)
    opened = DeltaTable(store.table_uri("rewards"))
    assert (opened.version(), opened.metadata().configuration) == (0, {})
