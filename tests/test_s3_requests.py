"""What reading an ``s3://`` store asks the server for (the real S3 API, moto, behind the counting proxy
:class:`tests.faulty_proxy.FaultyProxy`): an open replays only the commits since the last checkpoint, which
comes every 10 commits; data and index files of a snapshot the store holds are read at the sizes the Delta log
gives, with no HEAD. And what a build asks of an ``s3://`` OUT does not grow with the sets there: the same
requests at 2 sets as at 6, one manifest GET (the index's last line; it read every set's manifest before), one
GET of ``index.json``, no sample-id file (the frontier accounts for every set), and ``index.json`` is the index
of every manifest; a garbage index is no help, so the build after it reads every manifest once."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections import Counter

import pyarrow as pa
import pytest

import prl.store.index
from prl.ingestion.traces import ingest
from prl.schema import REWARDS
from prl.shards.build import build_shards
from prl.shards.index import index_json
from prl.shards.options import ShardOptions
from prl.shards.s3out import S3Out
from prl.store.changes import files_dataset, snapshot_files
from prl.store.tables import Store
from tests.fault_helpers import proxy  # noqa: F401
from tests.faulty_proxy import FaultyProxy
from tests.records import vllm_chat
from tests.s3_server import moto_endpoint, s3, use_endpoint  # noqa: F401
from tests.shards_fixtures import commit_group, reward, table

pytestmark = [pytest.mark.s3, pytest.mark.campaign]  # long: `make test-all`
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


def _out_request(line: str) -> str:
    """``METHOD what`` of a request against the OUT: a LIST by its prefix (`` /`` when by folder), else the
    object's file name (``part`` for a set's parts, ``backlog`` for the frontier's, the bucket's name for a
    HEAD of the bucket)."""
    method, target = line.split(" ")[:2]
    parts = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qs(parts.query)
    if method == "GET" and "list-type" in query:
        return f"LIST {query['prefix'][0]}{' /' if 'delimiter' in query else ''}"
    name = urllib.parse.unquote(parts.path).rsplit("/", 1)[-1]
    return f"{method} {'part' if name.startswith('part-') else 'backlog' if name.startswith('backlog-') else name}"


def test_a_build_asks_the_same_of_an_s3_out_at_2_sets_as_at_6(s3, proxy, monkeypatch, tmp_path):  # noqa: F811
    use_endpoint(monkeypatch, proxy.url)
    store, out = Store(str(tmp_path / "store")), s3.url("out")
    options = ShardOptions(target_tokens=400, seed=1)
    asked: dict[int, Counter[str]] = {}
    for sets in range(7):
        commit_group(store, f"g{sets}")
        start = len(proxy.requests)
        assert build_shards(store, out, options=options).status == "built"
        asked[sets] = Counter(_out_request(line) for line in proxy.requests[start:])
    assert asked[2] == asked[6]
    assert (asked[6]["GET manifest.json"], asked[6]["GET index.json"], asked[6]["GET sample_ids.arrow"]) == (1, 1, 0)
    assert {k: v for k, v in asked[6].items() if k.startswith("LIST")} == {
        "LIST .out.prl/sets/": 3,  # the sets when the build plans, when it cleans and when it writes the index
        "LIST out/ /": 1,  # set folders, and the meta folders of sets, for what killed uploads left
        "LIST .out.prl/sets/ /": 1,
        "LIST .out.prl/frontier/": 1,  # the backlog files the frontier no longer names
    }

    def index() -> bytes:
        return s3.client.get_object(Bucket=s3.bucket, Key=".out.prl/index.json")["Body"].read()

    assert index() == (json.dumps(index_json(S3Out(out).existing_sets()), indent=2, sort_keys=True) + "\n").encode()
    s3.put(".out.prl/index.json", b'{"schema_version": ')
    commit_group(store, "g7")
    start = len(proxy.requests)
    assert build_shards(store, out, options=options).status == "built"
    assert Counter(_out_request(line) for line in proxy.requests[start:])["GET manifest.json"] == 7  # all but its own
    assert index() == (json.dumps(index_json(S3Out(out).existing_sets()), indent=2, sort_keys=True) + "\n").encode()
