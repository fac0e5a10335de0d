"""SSE captures still being written: a stream open where a young file ends (no ``[DONE]`` yet, or cut
mid-line) is left for the next run, which reads it whole; a file that stopped changing quarantines it as
``truncated_stream``. The same on the bulk path (streams as servers lay them out) and the line framer's (CRLF)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import polars as pl
import pytest

from prl.ingestion.traces import ingest
from tests.delta_log import commit_infos

SAMPLE = (Path(__file__).parent.parent / "sample_data" / "traces" / "vllm_chat_stream.sse").read_bytes()
_END = SAMPLE.find(b"data: [DONE]\n\n") + len(b"data: [DONE]\n\n")
FIRST, SECOND = SAMPLE[:_END], SAMPLE[_END:]
THIRD = SECOND.replace(b"chatcmpl-aae1480f80a65a0478f20f3fce4dd65a", b"chatcmpl-3333333333333333333333333333333d")
IDS = [  # the second stream (and so the third) holds two choices
    "chatcmpl-0ba70b30b73b6b0f5d789616dafd9053#0",
    "chatcmpl-3333333333333333333333333333333d#0",
    "chatcmpl-3333333333333333333333333333333d#1",
    "chatcmpl-aae1480f80a65a0478f20f3fce4dd65a#0",
    "chatcmpl-aae1480f80a65a0478f20f3fce4dd65a#1",
]


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


def sample_ids(store) -> list[str]:
    return sorted(pl.read_delta(store.table_uri("traces"))["sample_id"].to_list())


def ledger(store) -> dict:
    (entry,) = commit_infos(store, "traces", limit=1)[0]["prl.sources"]
    return entry


@pytest.mark.parametrize("layout", ["servers", "crlf"])
@pytest.mark.parametrize("cut", ["before_done", "mid_line"])
def test_a_stream_still_being_written_is_left_for_the_next_run(store, tmp_path, layout, cut):
    form = crlf if layout == "crlf" else (lambda b: b)
    done_at = THIRD.rfind(b"data: [DONE]")
    cut_at = done_at if cut == "before_done" else THIRD.rfind(b"data: {", 0, done_at) + 40
    head, written = form(FIRST + SECOND), form(THIRD[:cut_at])
    path = tmp_path / "live.sse"
    path.write_bytes(head + written)
    first = ingest([str(path)], store)
    assert (first.samples, first.quarantined, first.files[0].held_back_bytes) == (3, {}, len(written))
    assert (ledger(store)["bytes_consumed"], ledger(store)["complete"]) == (len(head), False)
    assert store.version("quarantine") is None

    again = ingest([str(path)], store)  # unchanged and young: read on from the open stream, nothing lost
    assert (again.samples, again.already_present, again.quarantined) == (0, 0, {})
    assert (again.files[0].resumed_from, again.files[0].bytes_read) == (len(head), len(written))

    with open(path, "ab") as fh:  # the server finishes the stream
        fh.write(form(THIRD[cut_at:]))
    done = ingest([str(path)], store)
    assert (done.samples, done.already_present, done.quarantined) == (2, 0, {})
    assert done.files[0].resumed_from == len(head)
    assert (done.files[0].held_back_bytes, ledger(store)["complete"]) == (0, True)
    assert sample_ids(store) == IDS
    assert ingest([str(path)], store).files[0].status == "unchanged"
    assert store.version("quarantine") is None


@pytest.mark.parametrize("cut", ["before_done", "mid_line"])
def test_a_stream_cut_in_a_file_that_stopped_changing_is_quarantined(store, tmp_path, cut):
    done_at = THIRD.rfind(b"data: [DONE]")
    cut_at = done_at if cut == "before_done" else THIRD.rfind(b"data: {", 0, done_at) + 40
    path = tmp_path / "stopped.sse"
    path.write_bytes(FIRST + THIRD[:cut_at])
    old = time.time_ns() - 301 * 10**9  # past the default grace of 300 s
    os.utime(path, ns=(old, old))
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.files[0].held_back_bytes) == (1, 0)
    assert (ledger(store)["bytes_consumed"], ledger(store)["complete"]) == (len(FIRST) + cut_at, True)
    (q,) = pl.read_delta(store.table_uri("quarantine")).rows(named=True)
    first_line = FIRST.count(b"\n") + 1
    assert (q["reason"], q["source_line"], q["sample_id"]) == (
        "truncated_stream" if cut == "before_done" else "malformed_json",
        first_line,
        None,
    )
    assert ingest([str(path)], store).files[0].status == "unchanged"


def test_a_stream_cut_mid_file_is_quarantined_at_once(store, tmp_path):
    """A stream cut before its [DONE] and followed by another stream is not being written: it is quarantined
    even in a young file (only the stream open at the end is left to grow)."""
    done_at = THIRD.rfind(b"data: [DONE]")
    path = tmp_path / "cut.sse"
    path.write_bytes(THIRD[:done_at] + FIRST)
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.quarantined, result.files[0].held_back_bytes) == (1, {"truncated_stream": 1}, 0)
