"""The kill and fault campaign at full strength (``make crash``; marked ``campaign``, left out of ``make test``):
100 SIGKILLs per writing command (ingest, the reward side table, check-tokens, build-shards) on a local store and
OUT and 100 on an ``s3://`` store and OUT, and 100 network faults through a proxy in front of the S3 server
(dropped answers, resets, stalls; a quarter per command), each followed by a rerun and the full accounting of
:mod:`tests.crash_harness` (nothing lost, nothing duplicated, nothing shipped twice, no lock left; a campaign
whose accounting finds one fails). Its figures go to the log, one line per harness and one for the whole.

The twelve harnesses run side by side, ``PRL_CAMPAIGN_JOBS`` at a time (default: the machine's cores), the
longest first, each S3 one with a moto server of its own (a moto server is one process: two harnesses on one
would queue on its interpreter). A kill cycle is CPU-bound (the runs, their accounting and the S3 server's
requests: ``bench/bench_s3_kills.py``), so the campaign takes about its CPU time over the cores. Measured CPU
seconds per cycle (harness, its runs and the S3 server; some 150 cycles make 100 kills, runs that finish before
their kill being cycles too): on S3 2.3 (ingest), 2.1 (rewards), 3.4 (check), 4.5 (build-shards), where half of
check's and build-shards' requests are their set-up (the earlier steps over the grown input); locally 0.1 to 0.5;
a fault cycle 1.4 to 2.3. Extrapolated: about 1,850 CPU seconds for the S3 hundreds, under 200 for the local ones and
some 220 for the faults: about 19 minutes on two otherwise idle cores when the harnesses run side by side, where
the S3 hundreds one after another took 38 minutes. ``PRL_CAMPAIGN_KILLS`` and ``PRL_CAMPAIGN_FAULTS`` scale it
down for a measurement (1 kill per harness and 4 faults: 8.4 minutes under a load of 15 to 22 on two cores)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.s3_server import client_for, moto_server
from tests.test_crash_kills import COMMANDS, harness_argv, harness_env, s3_env, summary_of

KILLS = int(os.environ.get("PRL_CAMPAIGN_KILLS", "100"))
FAULTS = int(os.environ.get("PRL_CAMPAIGN_FAULTS", "100"))
JOBS = int(os.environ.get("PRL_CAMPAIGN_JOBS", str(os.cpu_count() or 2)))
ORDER = {"shards": 0, "check": 1, "rewards": 2, "ingest": 3}
"""Longest first (a command's cycles cost more the more steps its set-up runs)."""


def _job(kind: str, command: str, root: Path) -> dict[str, Any]:
    """One harness to its end: its summary with ``kind``, ``command`` and wall seconds."""
    root.mkdir(parents=True)
    started = time.monotonic()
    if kind == "local":
        argv = harness_argv(command, root, "--kills", str(KILLS))
        proc = subprocess.run(argv, env=harness_env(dict(os.environ)), capture_output=True, text=True)
    else:
        with moto_server() as endpoint:
            bucket = f"prl-{uuid.uuid4().hex[:12]}"
            client_for(endpoint).create_bucket(Bucket=bucket)
            extra = ["--kills", str(KILLS)] if kind == "s3" else ["--faults", str(-(-FAULTS // len(COMMANDS)))]
            argv = harness_argv(command, root, *extra, "--bucket", bucket)
            proc = subprocess.run(argv, env=harness_env(s3_env(endpoint, root)), capture_output=True, text=True)
    summary = summary_of(proc)
    return {"kind": kind, "command": command, "wall_s": round(time.monotonic() - started, 1), **summary}


def _figures(result: dict[str, Any]) -> str:
    """One log line: what the harness did and what its accounting found (it fails on anything but zeros)."""
    return (
        f"{result['kind']:>6} {result['command']:<8} kills {result['killed']:>4}  faults {result.get('faults', 0):>3}  "
        f"after a write {result['after_write']:>3}  cycles {result['cycles']:>4}  lost 0  duplicated 0  "
        f"shipped twice 0  {result['wall_s']:>7.1f} s"
    )


@pytest.mark.campaign
@pytest.mark.s3
def test_the_kill_and_fault_campaign_loses_duplicates_and_ships_twice_nothing(tmp_path, capsys):
    jobs = sorted(
        [(kind, command) for kind in ("s3", "faults", "local") for command in COMMANDS],
        key=lambda job: (job[0] == "local", ORDER[job[1]]),
    )
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        futures = [pool.submit(_job, kind, command, tmp_path / f"{kind}-{command}") for kind, command in jobs]
        results = [future.result() for future in futures]
    wall = time.monotonic() - started
    with capsys.disabled():
        print()
        for result in results:
            print(_figures(result))
        kills = sum(r["killed"] for r in results if r["kind"] != "faults")
        faults = sum(r.get("faults", 0) for r in results)
        print(
            f"campaign: {kills} kills, {faults} faults, lost 0, duplicated 0, shipped twice 0; "
            f"{wall / 60:.1f} min on {JOBS} jobs"
        )
        print(json.dumps({"campaign": results}))
    for result in results:
        if result["kind"] == "faults":
            assert result["faults"] >= -(-FAULTS // len(COMMANDS)), result
        else:
            assert result["killed"] >= KILLS, result
            # kills land inside the commands' work too (the last run: 13 to 75 of 100, build-shards the fewest)
            assert result["after_write"] >= KILLS // 20, result
