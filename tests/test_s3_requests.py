"""What reading an ``s3://`` store asks the server for (the real S3 API, moto, behind the counting proxy
:class:`tests.faulty_proxy.FaultyProxy`): an open replays only the commits since the last checkpoint, which
comes every 10 commits; data and index files of a snapshot the store holds are read at the sizes the Delta log
gives, with no HEAD."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest

import prl.store.index
from prl.ingestion.traces import ingest
from prl.schema import REWARDS
from prl.store.changes import files_dataset, snapshot_files
from prl.store.tables import Store
from tests.fault_helpers import proxy  # noqa: F401
from tests.faulty_proxy import FaultyProxy
from tests.records import vllm_chat
from tests.s3_server import moto_endpoint, s3, use_endpoint  # noqa: F401
from tests.shards_fixtures import reward, table

pytestmark = pytest.mark.s3
COMMIT = re.compile(r"/store/rewards/_delta_log/(\d{20})\.json")


def _rewards(*ids: str) -> list[pa.RecordBatch]:
    return table(REWARDS, [reward(i, 1.0) for i in ids]).to_batches()


def _since(proxy: FaultyProxy, start: int, method: str, pattern: str) -> list[str]:  # noqa: F811
    return [r.split(" ")[1] for r in proxy.requests[start:] if r.startswith(f"{method} ") and re.search(pattern, r)]


def test_an_open_replays_only_the_commits_since_the_checkpoint_at_19(s3, proxy, monkeypatch):  # noqa: F811
    writer = Store(s3.url("store"))
    for i in range(25):  # versions 1..25; delta-rs checkpoints after versions 9 and 19
        writer.commit("rewards", _rewards(f"s{i}:0"))
    assert sorted(k.rsplit("/", 1)[1] for k in s3.keys("store/rewards/_delta_log/") if "checkpoint" in k) == [
        "00000000000000000009.checkpoint.parquet",
        "00000000000000000019.checkpoint.parquet",
        "_last_checkpoint",
    ]
    use_endpoint(monkeypatch, proxy.url)
    start = len(proxy.requests)
    opened = Store(s3.url("store")).open("rewards")
    assert opened is not None and opened.version() == 25
    read = [int(m.group(1)) for r in proxy.requests[start:] if r.startswith("GET ") and (m := COMMIT.search(r))]
    assert sorted(set(read)) == list(range(20, 26))  # nothing before the checkpoint; each commit at most twice
    assert len(read) <= 2 * 6
    assert len(_since(proxy, start, "GET", r"/00000000000000000019\.checkpoint\.parquet")) >= 1


def test_files_of_the_pinned_snapshot_are_read_without_a_head(s3, proxy, monkeypatch):  # noqa: F811
    writer = Store(s3.url("store"))
    for i in range(3):
        writer.commit("rewards", _rewards(f"s{i}:0"))
    use_endpoint(monkeypatch, proxy.url)
    store = Store(s3.url("store"))
    version = store.version("rewards")
    assert version == 3
    paths = snapshot_files(store, "rewards", version)
    start = len(proxy.requests)
    assert files_dataset(store, "rewards", paths).to_table().num_rows == 3
    assert _since(proxy, start, "HEAD", r"/store/rewards/part-") == []
    assert len(_since(proxy, start, "GET", r"/store/rewards/part-")) >= 3

    unpinned = Store(s3.url("store"))  # holds no snapshot: each file's size is asked for, as before
    start = len(proxy.requests)
    assert files_dataset(unpinned, "rewards", paths).to_table().num_rows == 3
    assert len(_since(proxy, start, "HEAD", r"/store/rewards/part-")) == 3


@pytest.mark.parametrize(("whole_file_bytes", "gets"), [(1 << 20, 4), (0, 8)])
def test_an_ingest_reads_the_index_files_without_a_head(s3, proxy, monkeypatch, tmp_path, whole_file_bytes, gets):  # noqa: F811
    """Three index files and the one this ingest adds: one GET each when read whole, else two (footer and keys)."""
    monkeypatch.setattr(prl.store.index, "WHOLE_FILE_BYTES", whole_file_bytes)
    uri = s3.url("store")
    files = []
    for i in range(4):
        path = tmp_path / f"f{i}.jsonl"
        path.write_text(json.dumps(vllm_chat(f"r{i}", [1], [([2], [-1.0])])) + "\n")
        files.append(str(path))
    for path in files[:3]:
        ingest([path], uri)
    assert len([k for k in s3.keys("store/_index/") if k.endswith(".parquet")]) == 3
    use_endpoint(monkeypatch, proxy.url)
    start = len(proxy.requests)
    assert ingest([files[3]], uri).exit_code == 0
    assert _since(proxy, start, "HEAD", r"/store/_index/[^/]+/part-") == []
    assert len(_since(proxy, start, "GET", r"/store/_index/[^/]+/part-")) == gets
    assert Store(uri).read("traces").num_rows == 4
