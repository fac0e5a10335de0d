"""``prl build-shards --out s3://…`` against a real S3 API (moto_server): the set published is byte for byte the
set a local build writes, readers get exactly its rows, a second run ships nothing, an upload cut before its
manifest leaves no visible set and a rerun publishes once, rebuilds retire, bad OUTs are clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from prl.cli import app
from prl.errors import RetryableIOError, UsageError
from prl.io.locations import filesystem_for
from prl.schema import REWARDS
from prl.shards.build import build_shards
from prl.shards.frontier import frontier_path, read_frontier
from prl.shards.index import index_json
from prl.shards.layout import meta_root
from prl.shards.listing import list_sets
from prl.shards.options import ShardOptions
from prl.shards.s3out import S3Out
from prl.shards.verify import verify_shards
from prl.store.tables import Store
from tests.faulty_proxy import FaultyProxy
from tests.pipeline_helpers import prl_env
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401
from tests.shards_fixtures import commit_group, random_store, reward, table, trace, verdict

pytestmark = pytest.mark.s3

runner = CliRunner()
OPTIONS = ShardOptions(target_tokens=60, seed=5)


def local_files(out: str) -> dict[str, bytes]:
    """Every file under a local OUT, by path relative to OUT, less the frontier (``frontier*`` of the meta folder: what the
    next build need not scan; its backlog file has a name of its own in every OUT)."""
    files = {}
    for top, label in ((out, ""), (meta_root(out), "meta/")):
        for root, _, names in os.walk(top):
            for name in names:
                path = os.path.join(root, name)
                rel = label + os.path.relpath(path, top)
                if not rel.startswith("meta/frontier") and not rel.startswith("meta/out.json"):
                    files[rel] = Path(path).read_bytes()
    return files


def s3_files(s3, prefix: str) -> dict[str, bytes]:  # noqa: F811
    """Every object under ``prefix`` by key relative to it, less the frontier (as :func:`local_files`)."""
    meta = S3Out(f"s3://{s3.bucket}/{prefix}").mkey() + "/"
    files = {}
    for top, label in ((prefix, ""), (meta, "meta/")):
        for key in s3.keys(top):
            rel = label + key[len(top) :]
            if not rel.startswith("meta/frontier") and not rel.startswith("meta/out.json"):
                files[rel] = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    return files


def index_of_every_manifest(s3, out: str) -> bool:  # noqa: F811
    """Whether ``OUT/.prl/index.json`` is byte for byte the index of every manifest in ``out`` (read whole)."""
    body = s3.client.get_object(Bucket=s3.bucket, Key=f"{S3Out(out).mkey('index.json')}")["Body"].read()
    return body == (json.dumps(index_json(S3Out(out).existing_sets()), indent=2, sort_keys=True) + "\n").encode()


def test_an_s3_out_holds_the_bytes_of_a_local_build_and_reads_back_exactly(s3, tmp_path):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 12, 3)
    local = build_shards(store, str(tmp_path / "local"), options=OPTIONS)
    remote = build_shards(store, s3.url("runs//out/"), options=OPTIONS)
    assert (remote.status, remote.rows, remote.out) == ("built", 36, f"s3://{s3.bucket}/runs/out")
    assert remote.set_id == local.set_id and remote.shards == local.shards and len(remote.shards) > 1
    assert remote.set_dir == f"s3://{s3.bucket}/runs/out/{local.set_id}"
    assert remote.manifest_path == f"s3://{s3.bucket}/runs/.out.prl/sets/{local.set_id}/manifest.json"
    assert s3_files(s3, "runs/out/") == local_files(str(tmp_path / "local"))  # parts, ids, manifest, index

    listed = list_sets(s3.url("runs/out"))
    assert listed.files == [f"{remote.set_dir}/{e['file']}" for e in remote.shards]
    assert [s.rows for s in listed.sets] == [36]
    assert [s.set_id for s in list_sets(remote.set_dir).sets] == [remote.set_id]
    expected = pq.read_table(str(tmp_path / "local" / local.set_id)).sort_by("sample_id")

    fs, root = filesystem_for(remote.set_dir)
    assert pads.dataset(root, filesystem=fs, format="parquet").to_table().sort_by("sample_id").equals(expected)
    options = {
        "aws_endpoint_url": s3.endpoint,
        "aws_allow_http": "true",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_region": "us-east-1",
    }
    frame = pl.read_parquet(f"{remote.set_dir}/*.parquet", storage_options=options).sort("sample_id")
    assert frame.to_arrow().equals(pl.from_arrow(expected).to_arrow())
    duckdb = pytest.importorskip("duckdb")  # no httpfs extension here: DuckDB reads the downloaded parts
    for i, uri in enumerate(listed.files):
        key = uri.removeprefix(f"s3://{s3.bucket}/")
        (tmp_path / f"dl-{i}.parquet").write_bytes(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    query = f"select count(*), count(distinct sample_id) from '{tmp_path}/dl-*.parquet'"
    assert duckdb.connect().execute(query).fetchall() == [(36, 36)]

    checked = verify_shards(s3.url("runs/out"))
    assert (checked.exit_code, checked.sets, checked.rows, checked.shards) == (
        0,
        [remote.set_id],
        36,
        len(remote.shards),
    )
    assert checked.tokens == local.tokens and checked.bytes == sum(e["bytes"] for e in remote.shards)


def test_a_second_run_ships_nothing_and_new_samples_ship_once(s3, tmp_path):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 6, 2)
    out = s3.url("out")
    first = build_shards(store, out, options=OPTIONS)
    before = s3_files(s3, "out/")
    again = build_shards(store, out, options=OPTIONS)
    assert (again.status, again.already_shipped, again.rows) == ("nothing_new", 12, 0)
    assert s3_files(s3, "out/") == before
    store.commit("traces", table_of_new_samples())
    store.commit("rewards", rewards_of_new_samples())
    store.commit("checks", verdicts_of_new_samples())
    second = build_shards(store, out, options=OPTIONS)
    assert (second.status, second.rows, second.already_shipped) == ("built", 2, 12)
    assert [s.set_id for s in list_sets(out).sets] == sorted([first.set_id, second.set_id])
    index = json.loads(s3.client.get_object(Bucket=s3.bucket, Key=".out.prl/index.json")["Body"].read())
    assert [s["set_id"] for s in index["sets"]] == [first.set_id, second.set_id]
    assert index_of_every_manifest(s3, out) and verify_shards(out).exit_code == 0


def test_an_s3_out_reads_a_manifest_once_per_content_and_again_when_it_changes(s3, tmp_path, monkeypatch):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 6, 2)
    first = build_shards(store, s3.url("out"), options=OPTIONS)
    store.commit("traces", table_of_new_samples())
    store.commit("rewards", rewards_of_new_samples())
    store.commit("checks", verdicts_of_new_samples())
    second = build_shards(store, s3.url("out"), options=OPTIONS)
    key = f".out.prl/sets/{first.set_id}/manifest.json"
    body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    with FaultyProxy(s3.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        out = S3Out(s3.url("out"))
        listed = [out.existing_sets() for _ in range(2)]
        s3.put(key, json.dumps(json.loads(body)).encode())  # the same manifest, other bytes: another ETag
        listed.append(out.existing_sets())
    reads = [line.split()[1] for line in proxy.requests if line.startswith("GET ") and "manifest.json" in line]
    first_key, second_key = (f"/{s3.bucket}/.out.prl/sets/{i}/manifest.json" for i in (first.set_id, second.set_id))
    assert [[m.set_id for m in sets] for sets in listed] == [sorted([first.set_id, second.set_id])] * 3
    assert reads == [*sorted([first_key, second_key]), first_key]
    assert listed[0] == listed[1] == listed[2]  # the manifest read again is the same manifest


NEW = ["n0:0", "n1:0"]


def table_of_new_samples():
    from prl.schema import TRACES

    return table(TRACES, [trace(sid, "gn", [3, 4], [5, 6, 7]) for sid in NEW]).to_batches()


def rewards_of_new_samples():
    from prl.schema import REWARDS

    return table(REWARDS, [reward(NEW[0], 1.0), reward(NEW[1], 0.0)]).to_batches()


def verdicts_of_new_samples():
    from prl.schema import CHECKS

    return table(CHECKS, [verdict(sid) for sid in NEW]).to_batches()


class Cut(Exception):
    """The connection dies between the parts and the manifest."""


def test_an_upload_cut_before_its_manifest_is_invisible_and_a_rerun_publishes_once(s3, tmp_path, monkeypatch):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 10, 3)
    out = s3.url("out")
    real_put = S3Out._put_manifest

    def cut(self, set_id, body):
        raise Cut("connection reset")

    monkeypatch.setattr(S3Out, "_put_manifest", cut)
    with pytest.raises(Cut):
        build_shards(store, out, options=OPTIONS)
    parts = [k for k in s3.keys("out/") if k.endswith(".parquet")]
    assert len(parts) > 1  # the parts went up; no manifest, no index
    assert not [k for k in s3.keys("out/") if k.endswith(".json")]
    assert list_sets(out).sets == [] and verify_shards(out).sets == []

    monkeypatch.setattr(S3Out, "_put_manifest", real_put)
    sent: list[str] = []
    real_upload = S3Out._upload

    def counting(self, path, key, entry):
        was_sent = real_upload(self, path, key, entry)
        if was_sent:
            sent.append(key)
        return was_sent

    monkeypatch.setattr(S3Out, "_upload", counting)
    result = build_shards(store, out, options=OPTIONS)
    assert (result.status, result.rows, result.already_shipped) == ("built", 30, 0)
    assert sent == []  # the same set again: every part and the ids were there already, byte for byte
    checked = verify_shards(out)
    assert (checked.exit_code, checked.rows, checked.sets) == (0, 30, [result.set_id])
    assert index_of_every_manifest(s3, out)
    assert build_shards(store, out, options=OPTIONS).status == "nothing_new"


def test_a_cut_upload_of_a_set_that_is_never_rebuilt_is_removed_by_the_next_build(s3, tmp_path, monkeypatch):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 4, 2)
    out = s3.url("out")
    real_put = S3Out._put_manifest
    monkeypatch.setattr(S3Out, "_put_manifest", lambda self, set_id, body: (_ for _ in ()).throw(Cut()))
    with pytest.raises(Cut):
        build_shards(store, out, options=OPTIONS)
    orphan = {k.split("/")[1] for k in s3.keys("out/") if not k.startswith(".out.prl/")}
    monkeypatch.setattr(S3Out, "_put_manifest", real_put)
    store.commit("traces", table_of_new_samples())  # a new traces version: a new set id
    store.commit("rewards", rewards_of_new_samples())
    store.commit("checks", verdicts_of_new_samples())
    result = build_shards(store, out, options=OPTIONS)
    assert result.rows == 10 and orphan != {result.set_id}
    assert {k.split("/")[1] for k in s3.keys("out/") if not k.startswith(".out.prl/")} == {result.set_id}
    assert {k.split("/")[2] for k in s3.keys(".out.prl/sets/")} == {result.set_id}
    assert verify_shards(out).exit_code == 0


KILLED_AT_PUBLISH = """
import os, signal, sys
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.shards.s3out import S3Out
S3Out.publish = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
build_shards(sys.argv[1], sys.argv[2], options=ShardOptions(target_tokens=60, seed=5))
"""


def test_a_build_killed_with_its_set_staged_leaves_no_local_staging_past_the_next_build(s3, tmp_path, monkeypatch):  # noqa: F811
    """An S3 build stages its set on local disk; a SIGKILL cannot clean up after itself, so the next build into
    that OUT on this host removes the dead build's staging (parts, spills) before its own."""
    store = random_store(str(tmp_path / "store"), 6, 2)
    out = s3.url("out")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    env = prl_env({**environ_for(s3.endpoint), "TMPDIR": str(tmp_path / "tmp")})
    argv = [sys.executable, "-c", KILLED_AT_PUBLISH, store.uri, out]
    killed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = [name for _, _, names in os.walk(tmp_path / "tmp") for name in names]
    assert any(name.endswith(".parquet") for name in left)  # the dead build's parts, on local disk
    result = build_shards(store, out, options=OPTIONS)
    assert (result.status, result.rows) == ("built", 12)
    assert os.listdir(tmp_path / "tmp") == []


def test_a_build_killed_between_its_manifest_and_its_index_is_in_the_next_builds_index(s3, tmp_path, monkeypatch):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 3, 2)
    out = s3.url("out")
    build_shards(store, out, options=OPTIONS)
    commit_group(store, "k")
    real_index = S3Out.write_index
    monkeypatch.setattr(S3Out, "write_index", lambda self, index: (_ for _ in ()).throw(Cut()))
    with pytest.raises(Cut):
        build_shards(store, out, options=OPTIONS)
    monkeypatch.setattr(S3Out, "write_index", real_index)
    assert len(S3Out(out).set_ids()) == 2 and not index_of_every_manifest(s3, out)
    assert [(p.file, p.problem.split(":")[0]) for p in verify_shards(out).problems] == [
        ("index.json", "not the index of the sets' manifests")
    ]
    assert build_shards(store, out, options=OPTIONS).status == "nothing_new"  # nothing new: the index mended
    assert index_of_every_manifest(s3, out) and verify_shards(out).ok
    puts: list[object] = []
    with monkeypatch.context() as patched:
        patched.setattr(S3Out, "write_index", lambda self, index: puts.append(index))
        assert build_shards(store, out, options=OPTIONS).status == "nothing_new"
    assert puts == []  # an index that is right is not put again
    real_client = S3Out.client.fget  # type: ignore[attr-defined]

    class FailingGets:  # the bucket's client, but a GET of the index fails on the server's side
        def __init__(self, client):
            self._client = client

        def __getattr__(self, name):
            return getattr(self._client, name)

        def get_object(self, **kwargs):
            if not kwargs["Key"].endswith("index.json"):
                return self._client.get_object(**kwargs)
            raise ClientError({"Error": {"Code": "InternalError", "Message": "boom"}}, "GetObject")

    with monkeypatch.context() as patched:  # a failed read of the index: an error, not a reason to put another
        patched.setattr(S3Out, "client", property(lambda self: FailingGets(real_client(self))))
        patched.setattr(S3Out, "write_index", lambda self, index: puts.append(index))
        with pytest.raises(RetryableIOError, match="reading shard output"):
            S3Out(out).refresh_index()
    assert puts == []
    assert S3Out(out).read_unless_missing(S3Out(out).key("no-such-key")) is None  # missing, not failed: None
    commit_group(store, "l")
    assert build_shards(store, out, options=OPTIONS).status == "built"
    assert len(S3Out(out).set_ids()) == 3 and index_of_every_manifest(s3, out)


def test_a_rebuild_retires_the_sets_it_replaces(s3, tmp_path):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 6, 2)
    out = s3.url("out")
    first = build_shards(store, out, options=OPTIONS)
    store.commit("traces", table_of_new_samples())
    store.commit("rewards", rewards_of_new_samples())
    store.commit("checks", verdicts_of_new_samples())
    build_shards(store, out, options=OPTIONS)
    rebuilt = build_shards(store, out, options=OPTIONS, rebuild=True)
    assert (rebuilt.rows, rebuilt.already_shipped) == (14, 0)
    assert [s.set_id for s in list_sets(out).sets] == [rebuilt.set_id] != [first.set_id]
    assert {k.split("/")[1] for k in s3.keys("out/") if not k.startswith(".out.prl/")} == {rebuilt.set_id}
    index = json.loads(s3.client.get_object(Bucket=s3.bucket, Key=".out.prl/index.json")["Body"].read())
    assert [s["set_id"] for s in index["sets"]] == [rebuilt.set_id] and index_of_every_manifest(s3, out)
    again = build_shards(store, out, options=OPTIONS, rebuild=True)  # the same set: its manifest is already there
    assert again.set_id == rebuilt.set_id and verify_shards(out).exit_code == 0 and index_of_every_manifest(s3, out)


def test_a_damaged_part_on_s3_fails_verify_naming_it(s3, tmp_path):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 6, 2)
    result = build_shards(store, s3.url("out"), options=OPTIONS)
    key = f"out/{result.set_id}/part-00000.parquet"
    data = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.put(key, data[:-1] + bytes([data[-1] ^ 1]))
    s3.put(f"out/{result.set_id}/extra.txt", b"x")
    checked = verify_shards(s3.url("out"))
    assert checked.exit_code == 1
    assert [(p.file, p.problem.split(" ")[0]) for p in checked.problems] == [
        ("extra.txt", "a"),
        ("part-00000.parquet", "sha256"),
    ]


def test_the_cli_builds_lists_and_verifies_an_s3_out(s3, tmp_path):  # noqa: F811
    random_store(str(tmp_path / "store"), 4, 2)
    out = s3.url("out")
    res = runner.invoke(app, ["build-shards", "--store", str(tmp_path / "store"), "--out", out, "--json"])
    assert res.exit_code == 0, res.output
    built = json.loads(res.stdout)
    assert (built["status"], built["rows"], built["out"]) == ("built", 8, f"s3://{s3.bucket}/out")
    listed = runner.invoke(app, ["shards", "list", out, "--json"])
    assert json.loads(listed.stdout)["files"] == [f"{built['set_dir']}/{e['file']}" for e in built["shards"]]
    checked = runner.invoke(app, ["verify", out, "--json"])
    assert checked.exit_code == 0 and json.loads(checked.stdout)["rows"] == 8
    assert "testing" not in res.output + listed.output + checked.output


def test_a_recipe_out_on_s3(s3, tmp_path):  # noqa: F811
    random_store(str(tmp_path / "store"), 4, 2)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[store]\nuri = "store"\nout = "{s3.url("cron/out/")}"\n\n[shards]\ntarget_tokens = 60\n')
    res = runner.invoke(app, ["run", str(recipe), "--json"])
    assert res.exit_code == 0, res.output
    assert [s.rows for s in list_sets(s3.url("cron/out")).sets] == [8]


def test_an_s3_out_without_credentials_is_a_usage_error(s3, tmp_path, monkeypatch):  # noqa: F811
    random_store(str(tmp_path / "store"), 2, 2)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    res = runner.invoke(app, ["build-shards", "--store", str(tmp_path / "store"), "--out", s3.url("out"), "--json"])
    assert res.exit_code == 2
    assert "no AWS credentials in the environment" in json.loads(res.stdout)["error"]
    assert s3.keys() == [] and not os.path.exists(tmp_path / "store" / "_locks")


def test_a_missing_bucket_is_a_usage_error_and_a_dead_endpoint_retryable(s3, tmp_path, monkeypatch):  # noqa: F811
    store = random_store(str(tmp_path / "store"), 2, 2)
    with pytest.raises(UsageError, match="bucket 'no-such-bucket' does not exist"):
        build_shards(store, "s3://no-such-bucket/out")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://testing:secret@127.0.0.1:9")
    with pytest.raises(RetryableIOError) as caught:
        build_shards(store, s3.url("out"))
    assert "reaching shard output" in str(caught.value) and "secret" not in str(caught.value)
    with pytest.raises(UsageError, match="must be a local folder or an s3:// prefix"):
        build_shards(store, "gs://bucket/out")


def test_listing_an_s3_prefix_that_holds_no_set_is_a_usage_error(s3):  # noqa: F811
    res = runner.invoke(app, ["shards", "list", s3.url("nothing"), "--json"])
    assert res.exit_code == 2 and "holds no shard set" in json.loads(res.stdout)["error"]


def test_an_s3_out_keeps_a_frontier_and_its_next_build_is_the_bytes_of_a_whole_scan(s3, tmp_path):  # noqa: F811
    from tests.shards_fixtures import commit_traces, grouped_rows
    from tests.test_shards_frontier import OPTIONS as FRONTIER_OPTIONS
    from tests.test_shards_frontier import _history, _same_build

    store = Store(str(tmp_path / "store"))
    _history(store)
    out, whole = s3.url("runs/fast"), str(tmp_path / "whole")
    first = build_shards(store, out, options=FRONTIER_OPTIONS)
    assert (first.traces_scan, first.rows) == ({"from": "whole", "rows": 8}, 5)
    frontier = read_frontier(f"s3://{s3.bucket}/runs/fast")
    assert frontier is not None and (frontier.shipped, frontier.sets) == (5, (first.set_id,))
    backlog_key = f"runs/.fast.prl/frontier/{frontier.backlog}"
    assert backlog_key in s3.keys("runs/.fast.prl/frontier/")
    build_shards(store, whole, options=FRONTIER_OPTIONS)

    commit_traces(store, grouped_rows("n", 1, 2, version="step-12"))
    store.commit("rewards", table(REWARDS, [reward("b0-1:0", 1.0)]).to_batches())
    second = build_shards(store, out, options=FRONTIER_OPTIONS)
    assert second.traces_scan == {"from": "frontier", "rows": 3 + 2}
    os.remove(frontier_path(whole))
    twin = build_shards(store, whole, options=FRONTIER_OPTIONS)
    assert twin.traces_scan == {"from": "whole", "rows": 10}
    _same_build(second, twin)
    # the earlier backlog is gone, the new one is named by the new frontier
    newer = read_frontier(f"s3://{s3.bucket}/runs/fast")
    assert newer is not None and s3.keys("runs/.fast.prl/frontier/") == [f"runs/.fast.prl/frontier/{newer.backlog}"]
    assert verify_shards(out).exit_code == 0
    # a damaged frontier object is no frontier: the next build scans the whole table and ships nothing twice
    s3.client.put_object(Bucket=s3.bucket, Key="runs/.fast.prl/frontier.json", Body=b"{not json")
    assert read_frontier(f"s3://{s3.bucket}/runs/fast") is None
    again = build_shards(store, out, options=FRONTIER_OPTIONS)
    assert (again.status, again.traces_scan) == ("nothing_new", {"from": "whole", "rows": 10})


def test_a_build_in_turns_into_an_s3_out_records_pending_files_and_ships_each_sample_once(s3, tmp_path):  # noqa: F811
    from tests.shards_fixtures import commit_traces, grouped_rows

    store = Store(str(tmp_path / "store"))
    for i in range(3):
        commit_traces(store, grouped_rows(f"c{i}", 2, 2))
    out, options = s3.url("turns"), ShardOptions(kl="column", target_tokens=40, max_set_samples=4)
    res = build_shards(store, out, options=options)
    assert (res.rows, [s["rows"] for s in res.sets]) == (12, [4, 4, 4])
    frontier = read_frontier(out)
    assert frontier is not None and frontier.pending == () and len(frontier.sets) == 3
    assert verify_shards(out).exit_code == 0  # every set whole, nothing shipped twice
    again = build_shards(store, out, options=options)
    assert (again.status, again.sets) == ("nothing_new", [])
