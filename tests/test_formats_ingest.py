"""The new wire formats end to end through ``prl.ingest``: detection per file, exact rows, lineage."""

from __future__ import annotations

import os
import shutil
import time

import polars as pl
import pytest

from prl.ingestion.traces import ingest
from tests.formats_helpers import C1, C2, FIXTURES, L1, P1, P2


def _rows(store) -> pl.DataFrame:
    return pl.read_delta(store.table_uri("traces")).sort("source_line", "choice_index")


def _quarantine(store) -> pl.DataFrame:
    return pl.read_delta(store.table_uri("quarantine")).sort("source_line", "reason")


def test_sse_capture(store, tmp_path):
    path = tmp_path / "capture.sse"
    shutil.copy(FIXTURES / "sse/streams.sse", path)
    old = time.time_ns() - 3600 * 10**9  # a capture that stopped: its last stream, cut, is quarantined
    os.utime(path, ns=(old, old))
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert result.files[0].format == "sse"
    rows = _rows(store)
    assert rows["sample_id"].to_list() == ["chatcmpl-s1#0", "chatcmpl-s2#0", "chatcmpl-s2#1", "cmpl-s4#0"]
    assert rows["source_line"].to_list() == [3, 23, 23, 33]
    assert rows["source_format"].unique().to_list() == ["sse"]
    first = rows.row(0, named=True)
    assert first["prompt_token_ids"] == P1 and first["completion_token_ids"] == C1
    assert first["completion_logprobs"] == L1
    assert first["topk_ids"] == [[i, 400 + k] for k, i in enumerate(C1)]
    q = _quarantine(store)
    assert list(zip(q["source_line"].to_list(), q["reason"].to_list(), strict=True)) == [
        (31, "truncated_stream"),
        (39, "truncated_stream"),
    ]


@pytest.mark.parametrize(
    ("fixture", "fmt", "expected"),
    [
        ("rollouts/slime.jsonl", "slime", 2),
        ("rollouts/skyrl.jsonl", "skyrl", 3),
        ("envelopes/proxy_capture.jsonl", "proxy_capture", 2),
        ("vllm_generate/request_output.jsonl", "vllm_request_output", 3),
    ],
)
def test_detected_and_ingested(store, tmp_path, fixture, fmt, expected):
    path = tmp_path / "in.jsonl"
    shutil.copy(FIXTURES / fixture, path)
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.files[0].format, result.samples) == (fmt, expected)
    again = ingest([str(path)], store, max_quarantine_rate=None)
    assert again.samples == 0  # the ledger knows the file: nothing duplicated


def test_rollout_rows_keep_mask_and_null_masked_logprobs(store, tmp_path):
    path = tmp_path / "slime.jsonl"
    shutil.copy(FIXTURES / "rollouts/slime.jsonl", path)
    ingest([str(path)], store)
    second = _rows(store).row(1, named=True)
    assert second["prompt_token_ids"] == P2 and second["completion_token_ids"] == C2
    assert second["completion_mask"] == [True, False]
    assert second["completion_logprobs"] == [-0.5, None]
    assert second["finish_reason"] == "length"
    assert second["request_id"].startswith("sha256:")
