"""The fuzz campaign (:mod:`tests.fuzz_campaign`): mutated fixture lines of every format through ``ingest``,
``check-tokens`` and ``build-shards``. No traceback, no hang (the whole campaign under a wall-clock bound), and
every line accounted for. A sample runs with the suite; the million is a campaign
(``PRL_FUZZ_LINES`` sets its size, ``-s`` shows its figures)."""

from __future__ import annotations

import os
import time

import pytest

from tests.fuzz_campaign import run_campaign, run_parallel

SAMPLE_LINES = int(os.environ.get("PRL_FUZZ_SAMPLE_LINES", "3000"))
CAMPAIGN_LINES = int(os.environ.get("PRL_FUZZ_LINES", "1000000"))
CAMPAIGN_WORKERS = int(os.environ.get("PRL_FUZZ_WORKERS", "2"))
CAMPAIGN_SECONDS = float(os.environ.get("PRL_FUZZ_SECONDS", "3600"))
"""The campaign's bound on wall time: past it, something hangs."""


def _assert_accounted(figures) -> None:
    print("\n" + figures.summary())
    assert figures.failed_files == []
    assert (figures.unaccounted, figures.unaccounted_lines) == (0, [])
    assert figures.quarantined["parse_error"] == 0  # every bad value has a reason of its own
    assert figures.samples > 0 and sum(figures.quarantined.values()) > 0
    assert figures.records == figures.framed  # every record ingest read, as the formats frame the files
    assert figures.checked == figures.samples  # every kept sample has its verdict
    assert figures.considered == figures.samples == figures.shipped + figures.dropped
    assert figures.shipped > 0


def test_fuzz_sample(tmp_path):
    started = time.monotonic()
    figures = run_campaign(tmp_path, SAMPLE_LINES, seed=7, round_lines=SAMPLE_LINES)
    _assert_accounted(figures)
    assert figures.lines >= SAMPLE_LINES
    assert time.monotonic() - started < 300


@pytest.mark.campaign
def test_fuzz_campaign(tmp_path):
    started = time.monotonic()
    figures = run_parallel(tmp_path, CAMPAIGN_LINES, CAMPAIGN_WORKERS)
    _assert_accounted(figures)
    assert figures.lines >= CAMPAIGN_LINES
    assert time.monotonic() - started < CAMPAIGN_SECONDS
