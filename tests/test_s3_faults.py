"""Network faults between prl and S3, on the real S3 API (moto) behind :class:`tests.faulty_proxy.FaultyProxy`:
a commit whose answer is lost ends the run normally, a reset upload is exit 5 with one JSON object and a rerun
completes, and a run whose lock was taken over after a stall commits nothing (exit 3)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from prl.errors import ExitCode
from prl.store.s3lock import S3Lock
from prl.store.tables import Store
from tests.checks_helpers import tokenizer_dir
from tests.faulty_proxy import Fault, FaultyProxy
from tests.pipeline_helpers import REPO, GrowingInput, prl_argv, read_table
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401

pytestmark = pytest.mark.s3

COMMIT = r"/_delta_log/\d{20}\.json$"
DATA_FILE = r"/traces/part-[0-9a-f]+\.zstd\.parquet$"


@pytest.fixture
def proxy(moto_endpoint):  # noqa: F811
    with FaultyProxy(moto_endpoint) as running:
        yield running


def ingest(data: GrowingInput, store_uri: str, env: dict[str, str]) -> tuple[int, dict]:
    """``prl ingest --json`` in its own process; its exit code and its one JSON object."""
    proc = subprocess.run(
        prl_argv("ingest", str(data.root / "traces"), "--store", store_uri, "--json"),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    summary = json.loads(lines[0])
    assert summary["exit_code"] == proc.returncode
    return proc.returncode, summary


def assert_ingested_once(store: Store, data: GrowingInput) -> None:
    ids = read_table(store, "traces", ["sample_id"])["sample_id"].to_list()
    assert sorted(ids) == sorted(data.good)
    quarantine = read_table(store, "quarantine", ["source_uri", "source_line"])
    assert sorted(zip(quarantine["source_uri"], quarantine["source_line"])) == sorted(data.bad)


def fresh_input(tmp_path, records: int = 30) -> GrowingInput:
    data = GrowingInput(tmp_path / "in", files=1, seed=4, bad_every=1000)  # one malformed line: under 5 %
    data.grow(records)
    return data


@pytest.mark.parametrize("table", ["traces", "quarantine"])
def test_a_commit_whose_answer_is_lost_ends_the_run_normally(s3, proxy, tmp_path, table):  # noqa: F811
    data = fresh_input(tmp_path)
    store_uri = s3.url("store")
    fault = proxy.add(Fault("PUT", rf"/{table}{COMMIT}", "drop_answer"))
    code, summary = ingest(data, store_uri, environ_for(proxy.url))
    assert len(fault.hits) == 1  # the commit reached S3 and its answer was dropped
    assert (code, summary["samples"], summary["versions"][table]) == (0, len(data.good), 1)
    store = Store(store_uri)
    assert_ingested_once(store, data)
    code, again = ingest(data, store_uri, environ_for(proxy.url))  # the ledger holds: nothing new, nothing twice
    assert (code, again["samples"]) == (0, 0)
    assert_ingested_once(store, data)


def test_a_reset_upload_is_exit_5_and_a_rerun_completes(s3, proxy, tmp_path):  # noqa: F811
    data = fresh_input(tmp_path)
    store_uri = s3.url("store")
    fault = proxy.add(Fault("PUT", DATA_FILE, "reset", times=100))  # every retry of the upload meets it too
    started = time.monotonic()
    code, summary = ingest(data, store_uri, environ_for(proxy.url))
    assert fault.hits and time.monotonic() - started < 120
    assert code == ExitCode.RETRYABLE_IO and "writing traces" in summary["error"], summary
    store = Store(store_uri)
    assert store.read("traces").num_rows == 0 and s3.keys("store/_locks/") == []
    fault.times = 0
    code, summary = ingest(data, store_uri, environ_for(proxy.url))
    assert (code, summary["samples"]) == (0, len(data.good))
    assert_ingested_once(store, data)


def test_a_run_whose_lock_was_taken_over_after_a_stall_commits_nothing(s3, proxy, tmp_path):  # noqa: F811
    data = fresh_input(tmp_path)
    store_uri = s3.url("store")
    env = {**environ_for(proxy.url), "PRL_LOCK_STALE_AFTER": "1"}
    stall = proxy.add(Fault("PUT", DATA_FILE, "stall"))
    run = subprocess.Popen(
        prl_argv("ingest", str(data.root / "traces"), "--store", store_uri, "--json"),
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not stall.hits:  # the run is writing its data file, lock held, nothing committed yet
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.05)
        run.send_signal(signal.SIGSTOP)  # the whole process stalls: no more heartbeats
        time.sleep(2.5)
        thief = S3Lock(Store(store_uri).uri, "ingest", stale_after=1.0)
        thief._client = None
        thief.acquire()  # (straight to S3: the test's own environment points at the server)
        run.send_signal(signal.SIGCONT)
        proxy.release()
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == ExitCode.LOCKED, err
    (line,) = out.strip().splitlines()
    assert json.loads(line)["exit_code"] == 3 and "taken over by another run" in json.loads(line)["error"]
    store = Store(store_uri)
    assert store.read("traces").num_rows == 0 and store.read("quarantine").num_rows == 0
    assert json.loads(s3.client.get_object(Bucket=s3.bucket, Key="store/_locks/ingest.lock")["Body"].read())[
        "run_id"
    ] == (thief.run_id)  # the loser left the new holder's lock alone
    thief.release()


def test_lock_writes_whose_answers_are_lost_keep_the_lock(s3, proxy, tmp_path):  # noqa: F811
    data = fresh_input(tmp_path)
    store_uri = s3.url("store")
    # the put that takes the lock, its retry, and the beat before the first commit: each applied, answer lost
    fault = proxy.add(Fault("PUT", r"/_locks/ingest\.lock$", "drop_answer", times=3))
    code, summary = ingest(data, store_uri, environ_for(proxy.url))
    assert len(fault.hits) == 3
    assert (code, summary["samples"]) == (0, len(data.good)), summary
    assert_ingested_once(Store(store_uri), data)
    assert s3.keys("store/_locks/") == []  # released: the delete went to the lock's last ETag


def run_prl_json(args: list[str], env: dict[str, str]) -> tuple[int, dict]:
    """Any prl command with ``--json`` in its own process: its exit code and its one JSON object."""
    proc = subprocess.run(prl_argv(*args, "--json"), env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    assert json.loads(lines[0])["exit_code"] == proc.returncode
    return proc.returncode, json.loads(lines[0])


@pytest.mark.parametrize("table", ["rewards", "checks"])
def test_side_table_and_check_commits_whose_answers_are_lost_end_normally(s3, proxy, tmp_path, table):  # noqa: F811
    data = GrowingInput(tmp_path / "in", files=1, seed=5, bad_every=1000, real_text=True)
    data.grow(12)
    store_uri = s3.url("store")
    assert ingest(data, store_uri, environ_for(s3.endpoint))[0] == 0  # traces, straight to S3
    if table == "rewards":
        args = ["ingest", str(data.rewards_path), "--store", store_uri, "--kind", "rewards"]
    else:
        args = ["check-tokens", "--store", store_uri, "--tokenizer", tokenizer_dir()]
    fault = proxy.add(Fault("PUT", rf"/{table}{COMMIT}", "drop_answer"))
    code, summary = run_prl_json(args, environ_for(proxy.url))
    assert len(fault.hits) == 1 and code == 0, summary
    rows = read_table(Store(store_uri), table, ["sample_id"])["sample_id"].to_list()
    assert sorted(rows) == sorted(data.good)  # once each
    code, again = run_prl_json(args, environ_for(proxy.url))  # nothing new, nothing twice
    assert code == 0 and read_table(Store(store_uri), table, ["sample_id"]).height == len(data.good), again
