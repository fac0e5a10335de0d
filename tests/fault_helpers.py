"""What the network-fault tests share (``tests/test_s3_faults*.py``): the faulty proxy in front of the test S3
server, a prl command run in its own process with ``--json``, and a run stalled past its lock's stale time while
another run takes its S3 lock over.

Import the fixture in a test module that needs it::

    from tests.fault_helpers import proxy  # noqa: F401
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from prl.store.s3lock import S3Lock
from tests.faulty_proxy import Fault, FaultyProxy
from tests.pipeline_helpers import REPO, prl_argv
from tests.s3_server import moto_endpoint  # noqa: F401

COMMIT = r"/_delta_log/\d{20}\.json$"
"""A Delta commit of any table (the creation of its next log file)."""


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultyProxy]:  # noqa: F811
    with FaultyProxy(moto_endpoint) as running:
        yield running


def one_json(proc_stdout: str, proc_stderr: str, returncode: int) -> dict:
    """The one JSON object a ``--json`` run printed, checked: alone on stdout, no traceback, its ``exit_code``
    the process's."""
    lines = proc_stdout.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc_stderr, (proc_stdout, proc_stderr[-4000:])
    summary = json.loads(lines[0])
    assert summary["exit_code"] == returncode, summary
    return summary


def run_prl_json(args: list[str], env: dict[str, str], timeout: float = 180) -> tuple[int, dict]:
    """Any prl command with ``--json`` in its own process: its exit code and its one JSON object."""
    proc = subprocess.run(prl_argv(*args, "--json"), env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, one_json(proc.stdout, proc.stderr, proc.returncode)


def stalled_past_stale_time(
    proxy: FaultyProxy, args: list[str], env: dict[str, str], stall: Fault, thief: S3Lock
) -> tuple[int, dict]:
    """Run ``prl ARGS --json`` (through ``proxy``) until ``stall`` holds one of its requests, stop the whole
    process (no more heartbeats) until its lock is stale, let ``thief`` take the lock over, then let the run and
    its request go on; its exit code and JSON object. ``env`` should set ``PRL_LOCK_STALE_AFTER=1``; the thief's ``stale_after`` 1 s."""
    run = subprocess.Popen(
        prl_argv(*args, "--json"), env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not stall.hits:  # the run is in the request the stall holds, its lock held
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.05)
        run.send_signal(signal.SIGSTOP)  # the whole process stalls: no more heartbeats
        time.sleep(2.5)
        thief._client = None
        thief.acquire()  # (straight to S3: the test's own environment points at the server)
        run.send_signal(signal.SIGCONT)
        proxy.release()
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    return run.returncode, one_json(out, err, run.returncode)
