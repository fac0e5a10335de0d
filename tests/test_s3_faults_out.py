"""Network faults between ``prl build-shards`` and an ``s3://`` OUT (and store), on the real S3 API (moto) behind
:class:`tests.faulty_proxy.FaultyProxy`: a manifest or part put whose answer is lost publishes the set once, exit
0; part or manifest uploads reset every time are exit 5 with no visible set, and the rerun sends only what is
missing and publishes once; a build whose lock was taken over while a part upload stalled publishes nothing
(exit 3). Every time: one JSON object, every sample shipped exactly once, every set verifying."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from prl.errors import ExitCode
from prl.io.locations import filesystem_for
from prl.shards.listing import list_sets
from prl.shards.s3out import S3Out
from prl.shards.verify import verify_shards
from prl.store.locks import step_name
from prl.store.s3lock import S3Lock
from prl.store.tables import Store
from tests.fault_helpers import proxy, run_prl_json, stalled_past_stale_time  # noqa: F401
from tests.faulty_proxy import Fault, FaultyProxy
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401
from tests.shards_fixtures import random_store

pytestmark = [pytest.mark.s3, pytest.mark.campaign]  # long: `make test-all`

SET = r"v\d+-[0-9a-f]{12}"
PART = rf"/out/{SET}/part-\d+\.parquet$"
MANIFEST = rf"/\.out\.prl/sets/{SET}/manifest\.json$"
SAMPLES = 12


@pytest.fixture
def store_uri(s3) -> str:  # noqa: F811
    """An S3 store of 6 groups of 2 samples with rewards and verdicts (written straight to S3)."""
    return random_store(s3.url("store"), 6, 2).uri


def build(store_uri: str, out: str, env: dict[str, str]) -> tuple[int, dict]:
    """``prl build-shards --json`` into ``out`` with shards of about 60 tokens (several parts per set)."""
    args = ["build-shards", "--store", store_uri, "--out", out, "--set", "target_tokens=60", "--set", "seed=5"]
    return run_prl_json(args, env)


def through(proxy: FaultyProxy, tmp_path) -> dict[str, str]:  # noqa: F811
    """A child's environment: S3 through the proxy, local staging under ``tmp_path/tmp``."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**environ_for(proxy.url), "TMPDIR": str(tmp_path / "tmp")}


def shipped(out: str) -> list[str]:
    """Every sample id in the current sets' parts, sorted (a sample in two sets appears twice)."""
    ids: list[str] = []
    for uri in list_sets(out).files:
        fs, path = filesystem_for(uri)
        with fs.open_input_file(path) as fh:
            ids += pq.read_table(fh, columns=["sample_id"]).column("sample_id").to_pylist()
    return sorted(ids)


def assert_published_once(s3, out: str, tmp_path, sets: int = 1) -> None:  # noqa: F811
    assert len(list_sets(out).sets) == sets
    checked = verify_shards(out)
    assert (checked.exit_code, checked.rows) == (0, SAMPLES)
    assert shipped(out) == sorted(f"r{g}-{i}:0" for g in range(6) for i in range(2))
    assert s3.keys("store/_locks/") == []
    assert list((tmp_path / "tmp").iterdir()) == []  # no local staging left


def puts(proxy: FaultyProxy, pattern: str, since: int = 0) -> list[str]:  # noqa: F811
    """The PUT request lines since request ``since`` whose path matches ``pattern``."""
    return [r for r in proxy.requests[since:] if r.startswith("PUT ") and re.search(pattern, r.split(" ")[1])]


@pytest.mark.parametrize("what", [MANIFEST, PART])
def test_an_out_put_whose_answer_is_lost_publishes_the_set_once(s3, proxy, store_uri, tmp_path, what):  # noqa: F811
    out = s3.url("out")
    fault = proxy.add(Fault("PUT", what, "drop_answer"))
    code, summary = build(store_uri, out, through(proxy, tmp_path))
    assert len(fault.hits) == 1  # applied by S3, answer lost; the client's retry met it there
    assert (code, summary["status"], summary["rows"]) == (0, "built", SAMPLES), summary
    assert len(summary["shards"]) > 1
    assert_published_once(s3, out, tmp_path)
    code, again = build(store_uri, out, through(proxy, tmp_path))
    assert (code, again["status"], again["rows"]) == (0, "nothing_new", 0), again
    assert_published_once(s3, out, tmp_path)


def test_part_uploads_reset_are_exit_5_with_no_set_and_a_rerun_publishes_once(s3, proxy, store_uri, tmp_path):  # noqa: F811
    out = s3.url("out")
    fault = proxy.add(Fault("PUT", PART, "reset", times=1000, skip=1))  # the first part goes up, then none
    code, summary = build(store_uri, out, through(proxy, tmp_path))
    assert fault.hits and code == ExitCode.RETRYABLE_IO and "writing shard output" in summary["error"], summary
    assert not [k for k in s3.keys("out/") if k.endswith("manifest.json")]
    assert S3Out(out).set_ids() == [] and s3.keys("store/_locks/") == []
    sent = [k for k in s3.keys("out/") if re.search(PART, "/" + k)]
    assert len(sent) == 1  # the part that went up stays for the rerun
    fault.times = 0
    before = len(proxy.requests)
    code, summary = build(store_uri, out, through(proxy, tmp_path))
    assert (code, summary["status"], summary["rows"]) == (0, "built", SAMPLES), summary
    resent = [line.split(" ")[1] for line in puts(proxy, PART, before)]
    assert len(resent) == len(summary["shards"]) - 1 and not any(line.endswith("/" + sent[0]) for line in resent)
    assert_published_once(s3, out, tmp_path)


def test_a_manifest_put_reset_is_exit_5_and_the_rerun_sends_no_part_again(s3, proxy, store_uri, tmp_path):  # noqa: F811
    out = s3.url("out")
    fault = proxy.add(Fault("PUT", MANIFEST, "reset", times=1000))
    code, summary = build(store_uri, out, through(proxy, tmp_path))
    assert fault.hits and code == ExitCode.RETRYABLE_IO and "writing shard output" in summary["error"], summary
    assert S3Out(out).set_ids() == [] and s3.keys("store/_locks/") == []
    assert puts(proxy, PART)  # every part went up
    fault.times = 0
    before = len(proxy.requests)
    code, summary = build(store_uri, out, through(proxy, tmp_path))
    assert (code, summary["status"], summary["rows"]) == (0, "built", SAMPLES), summary
    assert puts(proxy, PART, before) == [] and len(puts(proxy, MANIFEST, before)) == 1
    assert_published_once(s3, out, tmp_path)


def test_a_build_whose_lock_was_taken_over_while_a_part_upload_stalled_publishes_nothing(
    s3,  # noqa: F811
    proxy,  # noqa: F811
    store_uri,
    tmp_path,
):
    out = s3.url("out")
    stall = proxy.add(Fault("PUT", PART, "stall"))
    thief = S3Lock(Store(store_uri).uri, step_name("build-shards", out), stale_after=1.0)
    env = {**through(proxy, tmp_path), "PRL_LOCK_STALE_AFTER": "1"}
    args = ["build-shards", "--store", store_uri, "--out", out, "--set", "target_tokens=60", "--set", "seed=5"]
    code, summary = stalled_past_stale_time(proxy, args, env, stall, thief)
    assert code == ExitCode.LOCKED and "taken over by another run" in summary["error"], summary
    assert not [k for k in s3.keys("out/") if k.endswith("manifest.json")] and S3Out(out).set_ids() == []
    body = s3.client.get_object(Bucket=s3.bucket, Key=f"store/_locks/{thief.step}.lock")["Body"].read()
    assert json.loads(body)["run_id"] == thief.run_id  # the loser left the new holder's lock alone
    thief.release()
    code, summary = build(store_uri, out, through(proxy, tmp_path))
    assert (code, summary["status"], summary["rows"]) == (0, "built", SAMPLES), summary
    assert_published_once(s3, out, tmp_path)
