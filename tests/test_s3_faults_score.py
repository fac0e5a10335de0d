"""Network faults between ``prl score-ref`` and an ``s3://`` store, on the real S3 API (moto) behind
:class:`tests.faulty_proxy.FaultyProxy` (the reference endpoint is reached directly): a ``ref_logprobs`` commit
whose answer is lost ends the run normally, an upload reset mid-run is exit 5 keeping the batches committed
before and a rerun scores exactly the rest, and a run whose lock was taken over after a stall commits nothing
(exit 3). Every time: each sample scored once, with the model's values, and one JSON object."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prl.errors import ExitCode
from prl.ingestion.traces import ingest
from prl.score.run import LOCK
from prl.store.s3lock import S3Lock
from prl.store.tables import Store
from tests.fault_helpers import COMMIT, proxy, run_prl_json, stalled_past_stale_time  # noqa: F401
from tests.faulty_proxy import Fault
from tests.pipeline_helpers import read_table
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401
from tests.score_helpers import Reference, build_tiny_model, score_server, write_traces

pytest.importorskip("torch")
pytestmark = [pytest.mark.s3, pytest.mark.campaign]  # long: `make test-all`

REF_DATA = r"/store/ref_logprobs/part-[0-9a-f]+\.zstd\.parquet$"
"""A part upload (``PUT …?partNumber=``) of a ``ref_logprobs`` data file."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return folder, Reference(folder)


@pytest.fixture
def filled(s3, tmp_path):  # noqa: F811
    """An S3 store holding traces (written straight to S3); its URI and its samples (id → prompt, completion)."""
    samples = write_traces(tmp_path / "in", 10, seed=7)
    store_uri = s3.url("store")
    ingest([str(tmp_path / "in")], Store(store_uri))
    return store_uri, samples


def score_args(store_uri: str, endpoint: str) -> list[str]:
    """``prl score-ref`` in batches of about 64 tokens (several commits per run)."""
    return ["score-ref", "--store", store_uri, "--ref-model", "tiny", "--endpoint", endpoint, "--batch-tokens", "64"]


def scored(store_uri: str) -> dict[str, list[float]]:
    """The ``ref_logprobs`` rows by sample id; a sample with two rows fails."""
    rows = read_table(Store(store_uri), "ref_logprobs", ["sample_id", "ref_logprobs"])
    ids = rows["sample_id"].to_list()
    assert len(ids) == len(set(ids)), "a sample was scored twice"
    return dict(zip(ids, rows["ref_logprobs"].to_list(), strict=True))


def assert_scored_once(store_uri: str, samples: dict[str, tuple], ref: Reference) -> None:
    refs = scored(store_uri)
    assert sorted(refs) == sorted(samples)
    for sample_id, (prompt, completion) in samples.items():
        np.testing.assert_allclose(refs[sample_id], ref.completion(prompt, completion), atol=1e-5, rtol=0)


def test_a_score_commit_whose_answer_is_lost_ends_the_run_normally(tiny, filled, proxy):  # noqa: F811
    _, ref = tiny
    store_uri, samples = filled
    fault = proxy.add(Fault("PUT", rf"/ref_logprobs{COMMIT}", "drop_answer", skip=1))  # the second commit's answer
    with score_server(ref) as (url, _):
        code, summary = run_prl_json(score_args(store_uri, url), environ_for(proxy.url))
        assert len(fault.hits) == 1 and len(fault.passed) == 1  # that commit reached S3; its answer did not
        assert (code, summary["scored"], summary["candidates"]) == (0, len(samples), len(samples)), summary
        assert summary["batches"] > 2
        assert_scored_once(store_uri, samples, ref)
        code, again = run_prl_json(score_args(store_uri, url), environ_for(proxy.url))  # nothing new, nothing twice
    assert (code, again["scored"], again["candidates"]) == (0, 0, 0), again
    assert_scored_once(store_uri, samples, ref)


def test_a_score_upload_reset_mid_run_is_exit_5_and_a_rerun_scores_exactly_the_rest(s3, tiny, filled, proxy):  # noqa: F811
    _, ref = tiny
    store_uri, samples = filled
    fault = proxy.add(Fault("PUT", REF_DATA, "reset", times=100, skip=1))  # the first batch's file goes up
    with score_server(ref) as (url, _):
        code, summary = run_prl_json(score_args(store_uri, url), environ_for(proxy.url))
        assert fault.hits and code == ExitCode.RETRYABLE_IO, summary
        assert "writing ref_logprobs" in summary["error"], summary
        assert s3.keys("store/_locks/") == []  # released on the way out
        kept = scored(store_uri)
        assert 0 < len(kept) < len(samples) and set(kept) <= set(samples)  # the first batch's commit holds
        fault.times = 0
        code, rest = run_prl_json(score_args(store_uri, url), environ_for(proxy.url))
    assert (code, rest["scored"], rest["candidates"]) == (0, len(samples) - len(kept), len(samples) - len(kept))
    assert_scored_once(store_uri, samples, ref)


def test_a_score_run_whose_lock_was_taken_over_after_a_stall_commits_nothing(s3, tiny, filled, proxy):  # noqa: F811
    _, ref = tiny
    store_uri, samples = filled
    stall = proxy.add(Fault("PUT", REF_DATA, "stall"))  # the first batch's data file, lock held
    thief = S3Lock(Store(store_uri).uri, LOCK, stale_after=1.0)
    env = {**environ_for(proxy.url), "PRL_LOCK_STALE_AFTER": "1"}
    with score_server(ref) as (url, _):
        code, summary = stalled_past_stale_time(proxy, score_args(store_uri, url), env, stall, thief)
        assert code == ExitCode.LOCKED and "taken over by another run" in summary["error"], summary
        assert scored(store_uri) == {}
        body = s3.client.get_object(Bucket=s3.bucket, Key=f"store/_locks/{LOCK}.lock")["Body"].read()
        assert json.loads(body)["run_id"] == thief.run_id  # the loser left the new holder's lock alone
        thief.release()
        code, rerun = run_prl_json(score_args(store_uri, url), environ_for(s3.endpoint))
    assert (code, rerun["scored"]) == (0, len(samples))
    assert_scored_once(store_uri, samples, ref)
