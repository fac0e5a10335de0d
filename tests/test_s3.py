"""``s3://`` sources and stores against a real S3 API (moto_server): exact values read back, the ledger and
re-runs, concurrent Delta commits, one ingest per store, stale-lock takeover, retryable errors without secrets."""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from prl.errors import ExitCode, RetryableIOError, UsageError
from prl.ingestion.side_tables import ingest_side_table
from prl.ingestion.traces import ingest
from prl.io.sources import _read_ahead, expand
from prl.schema import REWARDS
from prl.store.s3lock import S3Lock
from prl.store.tables import Store, filesystem_for, storage_options
from tests.delta_log import commit_infos
from tests.records import sglang_generate, vllm_chat, vllm_completion
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401

pytestmark = pytest.mark.s3

REPO = Path(__file__).resolve().parents[1]

CHAT = vllm_chat(
    "chat-a",
    [0, 128803, 19923, 128804],
    [([12, 1], [-0.25, -0.0625])],
    heads=[[[(12, -0.25), (13, -1.75)], [(1, -0.0625), (2, -3.5)]]],
)
COMPLETION = vllm_completion(
    "cmpl-b", [1, 2], [7, 9], [-0.5, -4.0], [{"token_id:7": -0.5, "token_id:3": -1.5}, {"token_id:9": -4.0}]
)
SGLANG = sglang_generate("rid-c", [0, 5, 6], [40, 41, 1], [-0.5, -1.25, -0.125])


def jsonl(*records: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def put_inputs(s3, prefix: str = "in/") -> dict[str, bytes]:  # noqa: F811
    """One plain, one gzip and one zstd trace file under ``prefix``; returns their stored bytes by key."""
    files = {
        f"{prefix}a.jsonl": jsonl(CHAT),
        f"{prefix}b.jsonl.gz": gzip.compress(jsonl(COMPLETION)),
        f"{prefix}c.jsonl.zst": zstandard.ZstdCompressor().compress(jsonl(SGLANG)),
    }
    for key, data in files.items():
        s3.put(key, data)
    return files


def make_store(kind: str, s3, tmp_path: Path) -> Store:  # noqa: F811
    return Store(s3.url("warehouse/store") if kind == "s3" else str(tmp_path / "store"))


def read_traces(store: Store) -> pl.DataFrame:
    return pl.read_delta(store.table_uri("traces"), storage_options=store.options or None).sort("sample_id")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_ingest_s3_prefix_plain_gz_zst_exact(kind, s3, tmp_path):  # noqa: F811
    files = put_inputs(s3)
    store = make_store(kind, s3, tmp_path)
    result = ingest([s3.url("in/")], store)
    assert result.exit_code == ExitCode.OK
    assert [(f.uri, f.format, f.status) for f in result.files] == [
        (s3.url("in/a.jsonl"), "openai_chat", "ingested"),
        (s3.url("in/b.jsonl.gz"), "openai_completions", "ingested"),
        (s3.url("in/c.jsonl.zst"), "sglang_generate", "ingested"),
    ]
    assert (result.samples, result.prompt_tokens, result.completion_tokens) == (3, 9, 7)

    df = read_traces(store)
    assert df["sample_id"].to_list() == ["chat-a#0", "cmpl-b#0", "rid-c#0"]
    assert df["source_uri"].to_list() == [s3.url("in/a.jsonl"), s3.url("in/b.jsonl.gz"), s3.url("in/c.jsonl.zst")]
    assert df["prompt_token_ids"].to_list() == [[0, 128803, 19923, 128804], [1, 2], [0, 5, 6]]
    assert df["completion_token_ids"].to_list() == [[12, 1], [7, 9], [40, 41, 1]]
    assert df["completion_logprobs"].to_list() == [[-0.25, -0.0625], [-0.5, -4.0], [-0.5, -1.25, -0.125]]
    assert df["topk_ids"].to_list()[0] == [[12, 13], [1, 2]]
    assert df["topk_logprobs"].to_list()[0] == [[-0.25, -1.75], [-0.0625, -3.5]]

    table = store.read("traces", columns=["sample_id", "completion_token_ids", "completion_logprobs"])
    rows = sorted(table.to_pylist(), key=lambda r: r["sample_id"])
    assert rows[2] == {
        "sample_id": "rid-c#0",
        "completion_token_ids": [40, 41, 1],
        "completion_logprobs": [-0.5, -1.25, -0.125],
    }
    assert table.schema.field("completion_logprobs").type == pa.list_(pa.float32())

    (info,) = commit_infos(store, "traces", limit=1)
    ledger = {entry["uri"]: entry for entry in info["prl.sources"]}
    for key, data in files.items():
        entry = ledger[s3.url(key)]
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        head = s3.client.head_object(Bucket=s3.bucket, Key=key)
        assert entry["mtime_ns"] == int(head["LastModified"].timestamp()) * 1_000_000_000


def test_s3_store_files_are_parquet_written_through_the_s3_filesystem(s3):  # noqa: F811
    put_inputs(s3)
    store = Store(s3.url("warehouse/store"))
    ingest([s3.url("in/")], store)
    parts = [k for k in s3.keys("warehouse/store/traces/") if k.endswith(".parquet")]
    assert len(parts) == 1 and parts[0].startswith("warehouse/store/traces/part-")
    fs, path = filesystem_for(s3.url(parts[0]))
    table = pq.read_table(path, filesystem=fs)
    assert sorted(table.column("sample_id").to_pylist()) == ["chat-a#0", "cmpl-b#0", "rid-c#0"]
    assert pq.read_metadata(path, filesystem=fs).row_group(0).column(0).compression == "ZSTD"
    assert s3.keys("warehouse/store/_locks/") == []  # the ingest lock is gone after the run


def test_rerun_adds_nothing_and_changed_object_adds_only_new(s3):  # noqa: F811
    put_inputs(s3)
    store = Store(s3.url("warehouse/store"))
    assert ingest([s3.url("in/")], store).samples == 3
    version = store.version("traces")
    again = ingest([s3.url("in/")], store)
    assert again.samples == 0 and again.bytes_read == 0
    assert [f.status for f in again.files] == ["unchanged"] * 3
    assert store.version("traces") == version
    # the single-key spelling has the same identity as the listed object
    assert ingest([s3.url("in/a.jsonl")], store).files[0].status == "unchanged"
    src = expand([s3.url("in/a.jsonl")])[0]
    assert store.transaction_version("traces", f"prl.source:{src.identity}") == 1
    # the object is replaced with more records: it is read on from where the last run stopped (ranged reads)
    old, new = jsonl(CHAT), jsonl(vllm_chat("chat-z", [3], [([4], [-2.0])]))
    s3.put("in/a.jsonl", old + new)
    grown = ingest([s3.url("in/")], store)
    assert (grown.samples, grown.already_present) == (1, 0)
    (read,) = [f for f in grown.files if f.status == "ingested"]
    assert (read.resumed_from, read.bytes_read, grown.bytes_read) == (len(old), len(new), len(new))
    assert {f.uri: f.status for f in grown.files} == {
        s3.url("in/a.jsonl"): "ingested",
        s3.url("in/b.jsonl.gz"): "unchanged",
        s3.url("in/c.jsonl.zst"): "unchanged",
    }
    assert read_traces(store)["sample_id"].to_list() == ["chat-a#0", "chat-z#0", "cmpl-b#0", "rid-c#0"]
    assert store.version("traces") == version + 1


def test_glob_and_single_key_sources(s3):  # noqa: F811
    put_inputs(s3)
    assert [f.uri for f in expand([s3.url("in/*.gz")])] == [s3.url("in/b.jsonl.gz")]
    (single,) = expand([s3.url("in/c.jsonl.zst")])
    assert single.size == len(zstandard.ZstdCompressor().compress(jsonl(SGLANG)))
    assert single.mtime_ns % 1_000_000_000 == 0


def _commit_rewards(store_uri: str, writer: int, commits: int, environ: dict[str, str]) -> list[int]:
    import os

    os.environ.update(environ)
    store = Store(store_uri)
    versions = []
    for i in range(commits):
        now = int(time.time() * 1000)
        batch = pa.RecordBatch.from_pylist(
            [
                {
                    "sample_id": f"w{writer}-{i}",
                    "name": "score",
                    "value": writer + i / 10,
                    "created_at": now,
                    "source_uri": "mem",
                    "source_line": i,
                    "ingested_at": now,
                }
            ],
            schema=REWARDS,
        )
        versions.append(store.commit("rewards", [batch], metadata={"writer": writer}).version)
    return versions


def test_concurrent_delta_commits_on_s3_all_land(s3):  # noqa: F811
    store = Store(s3.url("warehouse/store"))
    store.ensure("rewards")
    environ = environ_for(s3.endpoint)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_commit_rewards, [(store.uri, w, 3, environ) for w in range(3)])
    versions = sorted(v for vs in results for v in vs)
    assert versions == list(range(1, 10))  # nine commits, nine distinct versions after the create (0)
    df = pl.read_delta(store.table_uri("rewards"), storage_options=store.options).sort("sample_id")
    assert df["sample_id"].to_list() == [f"w{w}-{i}" for w in range(3) for i in range(3)]
    writers = sorted(info["prl.writer"] for info in commit_infos(store, "rewards") if "prl.writer" in info)
    assert writers == [0, 0, 0, 1, 1, 1, 2, 2, 2]


HOLDING_INGEST = """
import os, sys, time
from prl.ingestion.traces import ingest
started, go = sys.argv[3], sys.argv[4]
def progress(n):
    if not os.path.exists(started):
        open(started, "w").close()
        while not os.path.exists(go):
            time.sleep(0.05)
result = ingest([sys.argv[1]], sys.argv[2], progress=progress)
print(result.samples)
"""


def test_second_ingest_process_exits_locked_naming_the_holder(s3, tmp_path):  # noqa: F811
    put_inputs(s3)
    store_uri = s3.url("warehouse/store")
    env = environ_for(s3.endpoint)
    started, go = tmp_path / "started", tmp_path / "go"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDING_INGEST, s3.url("in/"), store_uri, str(started), str(go)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = subprocess.run(
            [sys.executable, "-m", "prl.cli", "ingest", s3.url("in/"), "--store", store_uri, "--json"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == ExitCode.LOCKED, second.stderr
        error = json.loads(second.stdout)
        assert error["exit_code"] == 3
        assert f"{socket.gethostname()}:{holder.pid}" in error["error"]
        assert f"{store_uri}/_locks/ingest.lock" in error["error"]
    finally:
        go.touch()
        out, err = holder.communicate(timeout=120)
    assert holder.returncode == 0, err
    assert out.strip() == "3"
    assert read_traces(Store(store_uri))["sample_id"].to_list() == ["chat-a#0", "cmpl-b#0", "rid-c#0"]


def test_stale_s3_lock_is_taken_over_by_ingest(s3, monkeypatch):  # noqa: F811
    put_inputs(s3)
    store = Store(s3.url("warehouse/store"))
    crashed = S3Lock(store.uri, "ingest")
    crashed.acquire()
    crashed._heartbeat.stop()  # the holder died: no heartbeat, no release
    with pytest.raises(Exception, match=crashed.run_id):
        ingest([s3.url("in/")], store)
    time.sleep(2.2)
    monkeypatch.setenv("PRL_LOCK_STALE_AFTER", "1")
    assert ingest([s3.url("in/")], store).samples == 3
    assert s3.keys("warehouse/store/_locks/") == []
    assert crashed.heartbeat() is False and crashed.lost


SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSENTINEL"
KEY_ID = "AKIASENTINEL0000KEY"


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prl.cli", "-v", "ingest", *args, "--json"],
        env={**env, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ACCESS_KEY_ID": KEY_ID},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_retryable_without_secrets(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode == ExitCode.RETRYABLE_IO, (proc.stdout, proc.stderr)
    error = json.loads(proc.stdout)
    assert error["exit_code"] == 5
    for text in expected:
        assert text in error["error"], error["error"]
    for output in (proc.stdout, proc.stderr):
        assert SECRET not in output and KEY_ID not in output
        assert "\x1b[31m" not in json.loads(proc.stdout)["error"]


def test_missing_source_bucket_is_retryable_and_clear(s3, tmp_path):  # noqa: F811
    proc = run_cli(["s3://no-such-bucket-prl/in/", "--store", str(tmp_path / "store")], environ_for(s3.endpoint))
    assert_retryable_without_secrets(proc, "bucket 'no-such-bucket-prl' does not exist", s3.endpoint)
    with pytest.raises(RetryableIOError, match="does not exist"):
        expand(["s3://no-such-bucket-prl/in/"])


def test_missing_store_bucket_is_retryable_and_clear(s3, tmp_path):  # noqa: F811
    put_inputs(s3)
    proc = run_cli([s3.url("in/"), "--store", "s3://no-such-bucket-prl/store"], environ_for(s3.endpoint))
    # the store's format marker is the first thing read there
    assert_retryable_without_secrets(proc, "s3://no-such-bucket-prl/store/_store.json", "NoSuchBucket")
    with pytest.raises(RetryableIOError, match="cannot open table 'traces' in s3://no-such-bucket-prl/store"):
        Store("s3://no-such-bucket-prl/store").open("traces")


def test_bad_endpoint_is_retryable_and_prints_no_secret(s3, tmp_path):  # noqa: F811
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens here once the socket closes
    env = {**environ_for(s3.endpoint), "AWS_ENDPOINT_URL": dead, "AWS_MAX_ATTEMPTS": "1"}  # no retries to wait out
    local = tmp_path / "in.jsonl"
    local.write_bytes(jsonl(CHAT))
    as_source = run_cli([s3.url("in/"), "--store", str(tmp_path / "store")], env)
    assert_retryable_without_secrets(as_source, f"cannot list {s3.url('in/')}")
    as_store = run_cli([str(local), "--store", s3.url("store")], env)
    assert_retryable_without_secrets(as_store, "cannot read _store.json of store", dead.removeprefix("http://"))


def test_aws_max_attempts_bounds_delta_retries_too(monkeypatch, tmp_path):
    """The standard ``AWS_MAX_ATTEMPTS`` (attempts, as boto3 counts them) becomes delta-rs' ``max_retries``
    (retries: one fewer); unset, delta-rs keeps its own default; a value that is not a count ≥ 1 is refused."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    assert "max_retries" not in storage_options()
    for attempts, retries in (("1", "0"), ("4", "3"), (" 10 ", "9")):
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", attempts)
        assert storage_options()["max_retries"] == retries
        assert Store("s3://bucket/store").options["max_retries"] == retries
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", bad)
        with pytest.raises(UsageError, match=f"AWS_MAX_ATTEMPTS must be a whole number of attempts >= 1, not '{bad}'"):
            storage_options()
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "two")
    (tmp_path / "in.jsonl").write_bytes(jsonl(CHAT))
    proc = run_cli([str(tmp_path / "in.jsonl"), "--store", "s3://bucket/store"], dict(os.environ))
    assert proc.returncode == 2, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["exit_code"] == 2 and "AWS_MAX_ATTEMPTS" in summary["error"]


def test_read_ahead_keeps_order_bounds_memory_and_raises_errors():
    produced: list[int] = []
    closed: list[bool] = []

    def chunks(fail_at: int | None):
        try:
            for i in range(100):
                if i == fail_at:
                    raise OSError("connection reset")
                produced.append(i)
                yield bytes([i])
        finally:
            closed.append(True)

    assert b"".join(_read_ahead(chunks(None), 2)) == bytes(range(100))
    produced.clear()
    with pytest.raises(OSError, match="connection reset"):
        list(_read_ahead(chunks(5), 2))
    produced.clear()
    reader = _read_ahead(chunks(None), 2)
    assert next(reader) == bytes([0])
    time.sleep(0.3)  # the producer fills its queue, then waits
    assert len(produced) <= 4  # one taken, two queued, one in hand
    reader.close()
    assert closed == [True, True, True]


def test_truncated_gzip_on_s3_is_quarantined_after_its_good_lines(s3, tmp_path):  # noqa: F811
    data = gzip.compress(jsonl(CHAT, vllm_chat("chat-b", [5], [([6], [-1.0])])))
    s3.put("in/cut.jsonl.gz", data[: len(data) - 8])  # the gzip trailer is gone: the data is whole
    store = Store(str(tmp_path / "store"))
    result = ingest([s3.url("in/cut.jsonl.gz")], store, max_quarantine_rate=None)
    assert result.samples == 2
    assert result.quarantined == {"truncated_input": 1}
    reasons = pl.read_delta(store.table_uri("quarantine"))["reason"].to_list()
    assert reasons == ["truncated_input"]


def test_rewards_and_ref_logprobs_from_s3_into_an_s3_store(s3):  # noqa: F811
    s3.put("rewards/r.jsonl.gz", gzip.compress(jsonl({"sample_id": "chat-a#0", "reward": 0.75})))
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"request_id": ["rid-c"], "choice_index": [0], "reward": [-0.5]}), sink)
    s3.put("rewards/r.parquet", sink.getvalue().to_pybytes())
    s3.put("rewards/r.csv", b"sample_id,name,value\ncmpl-b#0,format,1\n")
    s3.put(
        "ref/ref.jsonl.zst",
        zstandard.ZstdCompressor().compress(
            jsonl({"sample_id": "chat-a#0", "ref_model": "base", "ref_logprobs": [-0.5, -0.03125]})
        ),
    )
    store = Store(s3.url("warehouse/store"))
    rewards = ingest_side_table([s3.url("rewards/")], store, kind="rewards")
    assert (rewards.rows, rewards.quarantined) == (3, {})
    assert ingest_side_table([s3.url("ref/")], store, kind="ref").rows == 1
    df = pl.read_delta(store.table_uri("rewards"), storage_options=store.options).sort("sample_id")
    assert df.select("sample_id", "name", "value").rows() == [
        ("chat-a#0", "reward", 0.75),
        ("cmpl-b#0", "format", 1.0),
        ("rid-c#0", "reward", -0.5),
    ]
    ref = pl.read_delta(store.table_uri("ref_logprobs"), storage_options=store.options).row(0, named=True)
    assert (ref["sample_id"], ref["ref_model"], ref["ref_logprobs"]) == ("chat-a#0", "base", [-0.5, -0.03125])
    again = ingest_side_table([s3.url("rewards/")], store, kind="rewards")
    assert (again.rows, again.unchanged_files) == (0, 3)
    assert s3.keys("warehouse/store/_locks/") == []
