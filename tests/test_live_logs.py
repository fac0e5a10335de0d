"""Logs still being written: a plain file ending mid-line is left to grow (its last line is read by a later run,
exactly once); only a file that ends mid-line and has stopped changing quarantines that line."""

from __future__ import annotations

import json
import os
import time

import polars as pl
import pytest

from prl.errors import ExitCode, UsageError
from prl.ingestion.traces import ingest
from prl.io.sources import partial_line_grace
from tests.delta_log import commit_infos
from tests.records import vllm_chat

LINES = [json.dumps(vllm_chat(f"live{i}", [i + 1], [([i + 2], [-1.0])])).encode() for i in range(3)]


def _sample_ids(store) -> list[str]:
    return sorted(pl.read_delta(store.table_uri("traces"))["sample_id"].to_list())


def test_a_line_still_being_written_is_left_for_the_next_run(store, tmp_path):
    path = tmp_path / "live.jsonl"
    half = len(LINES[2]) // 2
    path.write_bytes(LINES[0] + b"\n" + LINES[1] + b"\n" + LINES[2][:half])
    first = ingest([str(path)], store)
    assert first.exit_code == ExitCode.OK
    assert (first.samples, first.quarantined, first.files[0].held_back_bytes) == (2, {}, half)
    assert store.version("quarantine") is None
    (entry,) = commit_infos(store, "traces", limit=1)[0]["prl.sources"]
    assert (entry["bytes_consumed"], entry["complete"]) == (len(LINES[0]) + len(LINES[1]) + 2, False)

    consumed = entry["bytes_consumed"]
    again = ingest([str(path)], store)  # unchanged, still young: read on from there, nothing new, nothing lost
    assert (again.files[0].status, again.samples, again.already_present, again.quarantined) == ("ingested", 0, 0, {})
    assert (again.files[0].resumed_from, again.files[0].bytes_read, again.bytes_read) == (consumed, half, half)

    with open(path, "ab") as fh:  # the server finishes the line
        fh.write(LINES[2][half:] + b"\n")
    done = ingest([str(path)], store)
    assert (done.samples, done.already_present, done.quarantined) == (1, 0, {})
    assert (done.files[0].held_back_bytes, done.files[0].resumed_from) == (0, consumed)
    assert _sample_ids(store) == ["live0#0", "live1#0", "live2#0"]
    assert ingest([str(path)], store).files[0].status == "unchanged"  # complete now: consumed
    assert _sample_ids(store) == ["live0#0", "live1#0", "live2#0"]


def test_a_file_that_stopped_mid_line_quarantines_the_line(store, tmp_path):
    path = tmp_path / "stopped.jsonl"
    path.write_bytes(LINES[0] + b"\n" + LINES[1][:40])
    young = ingest([str(path)], store, max_quarantine_rate=None)
    assert (young.samples, young.quarantined) == (1, {})
    old = time.time_ns() - 301 * 10**9  # past the default grace of 300 s
    os.utime(path, ns=(old, old))
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.already_present, result.quarantined) == (0, 0, {"truncated_line": 1})
    assert result.files[0].resumed_from == len(LINES[0]) + 1  # only the last line is read again
    q = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert (q["source_line"], q["reason"], q["raw"]) == (2, "truncated_line", LINES[1][:40].decode())
    assert ingest([str(path)], store).files[0].status == "unchanged"


def test_only_a_partial_line_is_not_consumed_while_young(store, tmp_path):
    path = tmp_path / "opened.jsonl"
    path.write_bytes(LINES[0][:10])
    result = ingest([str(path)], store)
    assert (result.files[0].status, result.files[0].held_back_bytes, result.quarantined) == ("empty", 10, {})
    path.write_bytes(LINES[0] + b"\n")
    assert ingest([str(path)], store).samples == 1


def test_grace_from_the_environment(store, tmp_path, monkeypatch):
    path = tmp_path / "zero.jsonl"
    path.write_bytes(LINES[0] + b"\n" + LINES[1][:40])
    monkeypatch.setenv("PRL_PARTIAL_LINE_GRACE", "0")
    assert partial_line_grace() == 0.0
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert result.quarantined == {"truncated_line": 1}


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_bad_grace_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv("PRL_PARTIAL_LINE_GRACE", value)
    with pytest.raises(UsageError, match="PRL_PARTIAL_LINE_GRACE must be a number of seconds"):
        partial_line_grace()
