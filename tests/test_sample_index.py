"""The sample index behind ingest's dedup: exact, caught up after a killed run, rebuilt when it cannot be."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest

import prl.store.index as index_module
from prl.ingestion.traces import ingest
from prl.store.changes import added_files
from prl.store.index import INDEX_TABLE, SampleIndex, key_batch, sample_keys
from tests.records import vllm_chat


def records(prefix: str, n: int, token: int = 2) -> list[dict]:
    return [vllm_chat(f"{prefix}{i}", [i + 1], [([token], [-1.0])]) for i in range(n)]


def index_rows(store) -> dict[str, str]:
    table = store.read(INDEX_TABLE) if store.open(INDEX_TABLE) else None
    assert table is not None
    return dict(zip(table.column("sample_id").to_pylist(), table.column("record_digest").to_pylist(), strict=True))


def covered(store) -> int | None:
    traces, idx = store.open("traces"), store.open(INDEX_TABLE)
    return idx.transaction_version(f"prl.index.traces:{traces.metadata().id}")


def test_keys_are_stable_blake2b_prefixes():
    assert sample_keys(["a#0"]).tolist() == [
        int.from_bytes(__import__("hashlib").blake2b(b"a#0", digest_size=8).digest(), "big", signed=True)
    ]
    batch = key_batch(pa.array(["b", "a", "c"]), pa.array(["db", "da", "dc"]))
    assert batch.column(0).to_pylist() == sorted(sample_keys(["b", "a", "c"]).tolist())
    assert dict(zip(batch.column(1).to_pylist(), batch.column(2).to_pylist())) == {"a": "da", "b": "db", "c": "dc"}


def test_each_ingest_commit_indexes_its_rows(store, write_trace):
    ingest([str(write_trace("a.jsonl", records("a", 3)))], store)
    ingest([str(write_trace("b.jsonl", records("b", 2)))], store)
    digests = dict(zip(*[store.read("traces").column(c).to_pylist() for c in ("sample_id", "record_digest")]))
    assert index_rows(store) == digests and len(digests) == 5
    assert covered(store) == store.version("traces")


def test_rows_committed_before_a_kill_are_found_from_the_log(store, write_trace, monkeypatch):
    def killed(self, version, rows):
        raise KeyboardInterrupt  # the run dies right after its traces commit

    monkeypatch.setattr(SampleIndex, "committed", killed)
    with pytest.raises(KeyboardInterrupt):
        ingest([str(write_trace("a.jsonl", records("a", 3)))], store)
    monkeypatch.undo()
    assert store.open(INDEX_TABLE) is None and store.read("traces").num_rows == 3
    again = ingest([str(write_trace("copy.jsonl", records("a", 3) + records("z", 1, token=9)))], store)
    assert (again.samples, again.already_present) == (1, 3)
    assert sorted(index_rows(store)) == ["a0#0", "a1#0", "a2#0", "z0#0"]
    assert covered(store) == store.version("traces")


def test_a_conflicting_record_behind_the_index_is_still_quarantined(store, write_trace, monkeypatch):
    ingest([str(write_trace("a.jsonl", records("a", 2)))], store)
    monkeypatch.setattr(SampleIndex, "committed", lambda self, version, rows: None)  # the index falls behind
    ingest([str(write_trace("b.jsonl", records("b", 2)))], store)
    monkeypatch.undo()
    assert covered(store) == store.version("traces") - 1
    result = ingest([str(write_trace("c.jsonl", records("b", 2, token=7)))], store)
    assert (result.samples, result.quarantined) == (0, {"duplicate_sample_id": 2})


def test_recreated_traces_table_never_reads_as_present(store, write_trace):
    ingest([str(write_trace("a.jsonl", records("a", 2)))], store)
    shutil.rmtree(store.table_uri("traces"))  # a new traces table; the old index describes rows that are gone
    again = ingest([str(write_trace("again.jsonl", records("a", 2)))], store)
    assert (again.samples, again.already_present) == (2, 0)
    assert sorted(index_rows(store)) == ["a0#0", "a1#0"]


def test_missing_index_is_rebuilt_from_the_snapshot(store, write_trace):
    ingest([str(write_trace("a.jsonl", records("a", 3)))], store)
    shutil.rmtree(f"{store.uri}/_index")
    again = ingest([str(write_trace("b.jsonl", records("a", 3)))], store)
    assert (again.samples, again.already_present) == (0, 3)
    assert sorted(index_rows(store)) == ["a0#0", "a1#0", "a2#0"]


def test_lookup_stays_exact_when_every_key_collides(store, write_trace, monkeypatch):
    monkeypatch.setattr(index_module, "sample_keys", lambda ids: np.zeros(len(list(ids)), dtype=np.int64))
    ingest([str(write_trace("a.jsonl", records("a", 3)))], store)
    result = ingest([str(write_trace("b.jsonl", records("a", 1) + records("b", 2)))], store)
    assert (result.samples, result.already_present, result.quarantined) == (2, 1, {})
    idx = SampleIndex(store)
    idx.refresh()
    assert sorted(idx.lookup(["a2#0", "b1#0", "nope#0"])) == ["a2#0", "b1#0"]


def test_dry_run_leaves_the_index_alone_but_still_dedups(store, write_trace):
    ingest([str(write_trace("a.jsonl", records("a", 2)))], store)
    shutil.rmtree(f"{store.uri}/_index")
    dry = ingest([str(write_trace("b.jsonl", records("a", 2) + records("b", 1)))], store, dry_run=True)
    assert (dry.samples, dry.already_present) == (1, 2)
    assert store.open(INDEX_TABLE) is None


def test_added_files_skip_rewrites_and_say_when_the_log_is_gone(store, write_trace):
    ingest([str(write_trace("a.jsonl", records("a", 2)))], store)
    ingest([str(write_trace("b.jsonl", records("b", 2)))], store)
    version = store.version("traces")
    table = store.open("traces")
    table.optimize.compact()
    assert store.version("traces") == version + 1
    assert added_files(store, "traces", version, version + 1) == []
    assert len(added_files(store, "traces", -1, version)) == 2
    (tmp := f"{store.table_path('traces')}/_delta_log/{0:020d}.json")
    shutil.move(tmp, tmp + ".gone")
    assert added_files(store, "traces", -1, version) is None


@pytest.mark.parametrize("whole_file_bytes", [1 << 20, 0])  # files read whole, or as footer and key column
def test_lookups_answer_the_same_whichever_way_index_files_are_read(store, write_trace, monkeypatch, whole_file_bytes):
    monkeypatch.setattr(index_module, "WHOLE_FILE_BYTES", whole_file_bytes)
    ingest([str(write_trace("a.jsonl", records("a", 3)))], store)
    ingest([str(write_trace("b.jsonl", records("b", 2)))], store)
    idx = SampleIndex(store)
    idx.refresh()
    assert [entry.fragment is None for entry in idx._files.values()] == [whole_file_bytes > 0] * 2
    digests = index_rows(store)
    assert idx.lookup(["a2#0", "b0#0", "nope#0"]) == {"a2#0": digests["a2#0"], "b0#0": digests["b0#0"]}
    again = ingest([str(write_trace("c.jsonl", records("a", 1) + records("c", 1)))], store)
    assert (again.samples, again.already_present) == (1, 1)


def test_an_index_commit_that_landed_before_its_call_failed_counts_as_done(store, write_trace, monkeypatch):
    """delta-rs writes a checkpoint after every tenth commit and raises when that fails, the commit made."""
    real = index_module.write_deltalake

    def landed_then_failed(*args, **kwargs):
        real(*args, **kwargs)
        raise OSError("writing the checkpoint failed")

    monkeypatch.setattr(index_module, "write_deltalake", landed_then_failed)
    result = ingest([str(write_trace("a.jsonl", records("a", 3)))], store)
    assert result.samples == 3
    assert sorted(index_rows(store)) == ["a0#0", "a1#0", "a2#0"]
    assert covered(store) == store.version("traces")


def test_an_index_commit_after_another_writers_metadata_commit_is_made_again(store, write_trace, monkeypatch):
    from deltalake import DeltaTable

    ingest([str(write_trace("a.jsonl", records("a", 2)))], store)
    real, calls = index_module.write_deltalake, []

    def property_set_meanwhile(table, *args, **kwargs):
        if not calls:  # what `prl maintain` does to a table an older prl created, while this run is on
            DeltaTable(store.table_uri(INDEX_TABLE)).alter.set_table_properties({"delta.checkpointInterval": "7"})
        calls.append(table.version())
        return real(table, *args, **kwargs)

    monkeypatch.setattr(index_module, "write_deltalake", property_set_meanwhile)
    result = ingest([str(write_trace("b.jsonl", records("b", 2)))], store)
    assert result.samples == 2
    assert calls == [calls[0], calls[0] + 1]  # made once more, against the table with the property commit
    assert sorted(index_rows(store)) == ["a0#0", "a1#0", "b0#0", "b1#0"]
    assert covered(store) == store.version("traces")


def test_rows_of_an_index_commit_that_landed_then_failed_are_found_in_the_same_run(store, write_trace, monkeypatch):
    """The run's kept index table did not move when the call failed after its commit: the rows must still be
    looked up in that run (the commit is made here through the table's URI, so the kept object stays behind)."""
    ingest([str(write_trace("a.jsonl", records("a", 2)))], store)
    real = index_module.write_deltalake

    def landed_then_failed(table, *args, **kwargs):
        real(store.table_uri(INDEX_TABLE), *args, **kwargs)
        raise OSError("writing the checkpoint failed")

    with store.one_run():
        idx = SampleIndex(store)
        idx.refresh()
        version = idx.covered
        assert version is not None
        monkeypatch.setattr(index_module, "write_deltalake", landed_then_failed)
        idx.committed(version + 1, {"b0#0": "d0", "b1#0": "d1"})
        assert idx.covered == version + 1
        assert idx.lookup(["b0#0", "b1#0", "a0#0", "nope#0"]).keys() == {"b0#0", "b1#0", "a0#0"}
