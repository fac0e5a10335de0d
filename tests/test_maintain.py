"""prl maintain: small files compacted, log checkpointed, unreferenced files vacuumed after the window only."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from prl.errors import LockedError, UsageError
from prl.ingestion.traces import ingest
from prl.maintain import DATA_ROW_GROUP_ROWS, maintain
from prl.options import MaintainOptions
from prl.pipeline.recipe import from_mapping
from prl.pipeline.runner import run
from prl.schema import TRACES
from prl.store.index import INDEX_TABLE, SampleIndex
from prl.store.locks import holding
from prl.store.tables import Store, scan_options
from tests.pipeline_helpers import run_prl
from tests.records import vllm_chat


def one_row(i: int) -> pa.Table:
    row = dict(
        sample_id=f"s{i}",
        request_id=f"s{i}",
        choice_index=0,
        group_id="g",
        prompt_token_ids=[1],
        completion_token_ids=[2, i],
        completion_logprobs=[-1.0, -0.5],
        finish_reason="stop",
        record_digest=f"d{i}",
        source_uri="u",
        source_line=i,
        source_format="f",
        ingested_at=0,
    )
    return pa.Table.from_pylist([row], schema=TRACES)


def data_files(store, table: str = "traces") -> list[str]:
    return sorted(f for f in os.listdir(store.table_path(table)) if f.endswith(".parquet"))


def aged(path: str, hours: float) -> None:
    then = time.time() - hours * 3600
    os.utime(path, (then, then))


def test_small_commits_become_one_file_and_old_versions_stay_readable(store):
    for i in range(12):
        store.commit("traces", one_row(i).to_batches())
    before = store.version("traces")
    expected = store.read("traces").sort_by("sample_id")
    result = maintain(store, retention_hours=1)
    (traces,) = result.tables
    assert (traces.table, traces.files_before, traces.files_after) == ("traces", 12, 1)
    assert (traces.files_compacted, traces.files_written, traces.checkpointed) == (12, 1, True)
    assert traces.files_vacuumed == 0  # the replaced files are younger than the window: old readers need them
    assert store.read("traces").sort_by("sample_id").equals(expected)
    assert store.read("traces", version=before).sort_by("sample_id").equals(expected)
    assert any(f.endswith(".checkpoint.parquet") for f in os.listdir(f"{store.table_path('traces')}/_delta_log"))


def test_vacuum_removes_orphans_past_the_window_and_keeps_what_old_versions_need(store):
    for i in range(3):
        store.commit("traces", one_row(i).to_batches())
    maintain(store, retention_hours=1)
    orphan = f"{store.table_path('traces')}/part-killed.zstd.parquet"  # written by a run killed before its commit
    fresh = f"{store.table_path('traces')}/part-in-flight.zstd.parquet"  # a write happening right now
    for path in (orphan, fresh):
        with open(path, "wb") as fh:
            fh.write(b"PAR1")
    for name in data_files(store):
        if "in-flight" not in name:
            aged(f"{store.table_path('traces')}/{name}", 2)
    result = maintain(store, retention_hours=1)
    # the orphan goes; the files compaction replaced were removed from the log moments ago (a reader of an
    # older version may still need them for the window), and the in-flight file is young
    assert result.tables[0].files_vacuumed == 1
    remaining = data_files(store)
    assert "part-in-flight.zstd.parquet" in remaining and "part-killed.zstd.parquet" not in remaining
    assert len(remaining) == 3 + 1 + 1 and store.read("traces").num_rows == 3
    assert store.read("traces", version=1).num_rows == 1


def test_dry_run_lists_what_vacuum_would_delete_and_changes_nothing(store):
    store.commit("traces", one_row(0).to_batches())
    orphan = f"{store.table_path('traces')}/part-killed.zstd.parquet"
    with open(orphan, "wb") as fh:
        fh.write(b"PAR1")
    aged(orphan, 5)
    version = store.version("traces")
    result = maintain(store, retention_hours=1, dry_run=True)
    assert (result.tables[0].files_vacuumed, result.tables[0].checkpointed) == (1, False)
    assert os.path.exists(orphan) and store.version("traces") == version


def test_the_sample_index_is_maintained_and_still_answers(store, write_trace):
    for i in range(4):
        ingest([str(write_trace(f"f{i}.jsonl", [vllm_chat(f"r{i}", [1], [([2], [-1.0])])]))], store)
    result = maintain(store, retention_hours=1)
    by_table = {t.table: t for t in result.tables}
    assert set(by_table) == {"traces", INDEX_TABLE}
    assert by_table[INDEX_TABLE].files_after == 1
    index = SampleIndex(store)
    index.refresh()  # the compaction commit on traces brought no new rows: nothing to catch up
    assert index.covered == store.version("traces")
    assert sorted(index.lookup(["r0#0", "r3#0", "zz#0"])) == ["r0#0", "r3#0"]
    again = ingest([str(write_trace("again.jsonl", [vllm_chat("r2", [1], [([2], [-1.0])])]))], store)
    assert (again.samples, again.already_present) == (0, 1)


def test_bad_options_and_a_held_lock(store):
    store.commit("traces", one_row(0).to_batches())
    with pytest.raises(UsageError, match="retention"):
        maintain(store, retention_hours=0)
    with pytest.raises(UsageError, match="unknown table"):
        maintain(store, tables=["nope"])
    with holding(store.uri, "maintain"), pytest.raises(LockedError):
        maintain(store)


def test_cli_maintain_json_and_a_recipe_step(store, tmp_path):
    for i in range(3):
        store.commit("traces", one_row(i).to_batches())
    res = run_prl("maintain", "--store", store.uri, "--retention-hours", "2", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["command"], summary["retention_hours"], summary["exit_code"]) == ("maintain", 2, 0)
    assert [(t["table"], t["files_before"], t["files_after"]) for t in summary["tables"]] == [("traces", 3, 1)]
    store.commit("traces", one_row(3).to_batches())
    recipe = tmp_path / "cron.toml"
    recipe.write_text(f'[store]\nuri = "{store.uri}"\n\n[maintain]\nretention_hours = 24\ntarget_mb = 64\n')
    result = run(str(recipe))
    assert [(s.step, s.status, s.exit_code) for s in result.steps] == [("maintain", "done", 0)]
    assert result.steps[0].summary["tables"][0]["files_after"] == 1


def test_recipe_maintain_values_are_checked(tmp_path):
    for bad in ({"retention_hours": 0}, {"target_mb": 1.5}, {"retention_hours": True}, {"vacuum": 1}):
        with pytest.raises(UsageError, match=r"\[maintain\]"):
            from_mapping({"store": {"uri": "s"}, "maintain": bad})
    recipe = from_mapping({"store": {"uri": str(tmp_path)}, "maintain": {}})
    assert recipe.steps == ("maintain",) and recipe.maintain == MaintainOptions(168, 128)


def test_compacted_files_keep_row_groups_a_reader_can_hold(store):
    # delta-rs would write one row group per compacted file: readers decode a row group at a time, so their memory
    # would follow the file's size; compaction writes DATA_ROW_GROUP_ROWS rows per group, floats split as prl does
    rows = [one_row(i).to_pylist()[0] | {"temperature": 0.5 + i % 3} for i in range(DATA_ROW_GROUP_ROWS + 904)]
    for part in (rows[:3000], rows[3000:]):
        store.commit("traces", pa.Table.from_pylist(part, schema=TRACES).to_batches())
    expected = store.read("traces").sort_by("sample_id")
    maintain(store, retention_hours=1)
    (path,) = DeltaTable(store.table_uri("traces")).file_uris()
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [DATA_ROW_GROUP_ROWS, 904]
    columns = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert "BYTE_STREAM_SPLIT" in columns["temperature"].encodings
    assert store.read("traces").sort_by("sample_id").equals(expected)


def test_local_scans_read_column_chunks_as_they_go_and_s3_scans_prebuffer(tmp_path):
    assert Store(str(tmp_path / "store")).scan_options.pre_buffer is False
    assert scan_options(remote=True).pre_buffer is True
