"""Network faults between prl and S3, on the real S3 API (moto) behind :class:`tests.faulty_proxy.FaultyProxy`:
a commit whose answer is lost ends the run normally, a reset upload is exit 5 with one JSON object and a rerun
completes, and a run whose lock was taken over after a stall commits nothing (exit 3)."""

from __future__ import annotations

import json
import time

import pytest

from prl.errors import ExitCode
from prl.store.s3lock import S3Lock
from prl.store.tables import Store
from tests.checks_helpers import tokenizer_dir
from tests.fault_helpers import COMMIT, proxy, run_prl_json, stalled_past_stale_time  # noqa: F401
from tests.faulty_proxy import Fault
from tests.pipeline_helpers import GrowingInput, read_table
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401

pytestmark = [pytest.mark.s3, pytest.mark.campaign]  # long: `make test-all`

DATA_FILE = r"/traces/part-[0-9a-f]+\.zstd\.parquet$"


def ingest(data: GrowingInput, store_uri: str, env: dict[str, str]) -> tuple[int, dict]:
    """``prl ingest --json`` in its own process; its exit code and its one JSON object."""
    return run_prl_json(["ingest", str(data.root / "traces"), "--store", store_uri], env)


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
    thief = S3Lock(Store(store_uri).uri, "ingest", stale_after=1.0)
    args = ["ingest", str(data.root / "traces"), "--store", store_uri]
    code, summary = stalled_past_stale_time(proxy, args, env, stall, thief)
    assert code == ExitCode.LOCKED and "taken over by another run" in summary["error"], summary
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
