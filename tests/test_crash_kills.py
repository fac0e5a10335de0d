"""SIGKILLs per writing command (ingest, the reward side table, check-tokens, build-shards), each at a seeded
random instant of the command's run, each followed by a rerun to completion and a full accounting: every input
line exactly once in its table or quarantine (a line still being written in neither, until it is finished),
every reward event once, every sample checked once, every published shard set complete and verifying, nothing
shipped twice, no lock left (see :mod:`tests.crash_harness`, which forks the runs from one interpreter so that a
kill cycle costs the runs, not an interpreter start). The same for every command on an ``s3://`` store and OUT
(moto server), with the default stale time (300 s): each kill there leaves its S3 lock behind, and the rerun
takes it over at once because its holder ran on this host and is gone (:mod:`prl.store.liveness`), never by
waiting; and network faults through a proxy in front of the S3 server (dropped answers, resets, stalls), each run
ending done or with a retryable error, then the same rerun and accounting.

These are the small samples ``make test`` runs (``PRL_CRASH_KILLS``, ``PRL_CRASH_S3_KILLS`` and
``PRL_CRASH_FAULTS`` per command, 2, 1 and 1 by default); the campaign at full strength, 100 kills per command on
each kind of store and 100 faults, is :mod:`tests.test_kill_campaign` (``make crash``). ``PRL_KILL_SEED`` sets the
seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.pipeline_helpers import prl_env
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401

KILLS = int(os.environ.get("PRL_CRASH_KILLS", "2"))
S3_KILLS = int(os.environ.get("PRL_CRASH_S3_KILLS", "1"))
FAULTS = int(os.environ.get("PRL_CRASH_FAULTS", "1"))
SEED = int(os.environ.get("PRL_KILL_SEED", "20261201"))
COMMANDS = ["ingest", "rewards", "check", "shards"]


def harness_argv(command: str, root, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tests.crash_harness",
        command,
        str(root),
        "--seed",
        str(SEED + COMMANDS.index(command)),
        *extra,
    ]


def harness_env(env: dict[str, str]) -> dict[str, str]:
    return prl_env({**env, "TOKENIZERS_PARALLELISM": "false", "POLARS_MAX_THREADS": "1"})


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict:
    """The harness's JSON summary (the last line of its stdout), after checking it ran clean."""
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-4000:]
    summary = json.loads(lines[-1])
    assert proc.returncode == 0, summary.get("error", summary)
    assert summary["samples"] > 0
    return summary


def run_harness(command: str, root, kills: int, env: dict[str, str], *extra: str, after_write: int = 0) -> dict:
    """Run the harness; its summary. ``after_write``: the fewest kills that must land after the command wrote."""
    argv = harness_argv(command, root, "--kills", str(kills), *extra)
    proc = subprocess.run(argv, env=harness_env(env), capture_output=True, text=True, timeout=max(1200, 30 * kills))
    summary = summary_of(proc)
    assert summary["killed"] >= kills
    assert summary["after_write"] >= after_write, summary  # kills land inside the command's work too
    return summary


def s3_env(endpoint: str, root) -> dict[str, str]:
    """A harness's environment on the test S3 server, with the default stale time."""
    env = {k: v for k, v in environ_for(endpoint).items() if k != "PRL_LOCK_STALE_AFTER"}
    return {**env, "TMPDIR": str(root)}


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_sigkills_lose_and_duplicate_nothing(tmp_path, command):
    run_harness(command, tmp_path, KILLS, dict(os.environ), after_write=KILLS // 10)


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.campaign  # the S3 sample: `make test-all` (make test keeps the local kills)
@pytest.mark.parametrize("command", COMMANDS)
def test_sigkills_on_an_s3_store_and_out_lose_and_duplicate_nothing(s3, tmp_path, command):  # noqa: F811
    # kills that land after a write: 7-37 of 100 on S3 (build-shards the fewest), so in a small sample a floor
    # would fail by chance; the campaign (100 per command: at least 5) holds one
    floor = S3_KILLS // 20 if S3_KILLS >= 100 else 0
    run_harness(command, tmp_path, S3_KILLS, s3_env(s3.endpoint, tmp_path), "--bucket", s3.bucket, after_write=floor)
    assert s3.keys("store/_locks/") == []


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.campaign  # the full campaign runs 100 faults (tests/test_kill_campaign.py); this sample in `make test-all`
@pytest.mark.parametrize("command", COMMANDS)
def test_network_faults_on_s3_lose_and_duplicate_nothing(s3, tmp_path, command):  # noqa: F811
    argv = harness_argv(command, tmp_path, "--faults", str(FAULTS), "--bucket", s3.bucket)
    env = harness_env(s3_env(s3.endpoint, tmp_path))
    summary = summary_of(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200))
    assert summary["faults"] >= FAULTS and sum(summary["by_fault"].values()) == summary["faults"]
    assert s3.keys("store/_locks/") == []
