"""Which paths are stores (prl.store.resolve): a path that is not one is exit 2 and creates nothing; ingest starts
a new store only where that buries nothing; unwritable stores and credentials in URLs are reported plainly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl.cli import app
from tests.pipeline_helpers import GrowingInput, invoke_json, tree, write_recipe
from tests.s3_server import moto_endpoint, s3  # noqa: F401

runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("built")
    data = GrowingInput(root / "in", files=1, seed=21)
    data.grow(6)
    res = runner.invoke(app, ["run", str(data.recipe(root / "store", root / "out")), "--json"])
    assert res.exit_code == 0, res.output
    set_dir = json.loads(res.stdout)["steps"][2]["summary"]["set_dir"]
    return {"root": root, "data": data, "set_dir": Path(set_dir)}


def test_reading_commands_refuse_what_is_not_a_store_and_create_nothing(built, tmp_path, tokenizer_dir):
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    candidates = {
        "mistyped": (tmp_path / "stroe", "no such folder"),
        "empty": (tmp_path / "empty", "it holds no prl table"),
        "shard set": (built["set_dir"], "it holds a shard set"),
        "shard OUT": (built["root"] / "out", ""),  # an OUT folder: no Delta table in it
        "file": (tmp_path / "a-file", "it is a file"),
    }
    before = tree(built["root"]), tree(tmp_path)
    for name, (path, why) in candidates.items():
        commands = [
            ["check-tokens", "--store", str(path), "--tokenizer", tokenizer_dir],
            ["build-shards", "--store", str(path), "--out", str(tmp_path / "out"), "--set", "require_checks=false"],
            ["maintain", "--store", str(path)],
            ["maintain", "--store", str(path), "--dry-run"],
            ["score-ref", "--store", str(path), "--ref-model", "ref", "--endpoint", "http://127.0.0.1:9/v1"],
        ]
        for args in commands:
            code, summary = invoke_json(args)
            assert code == 2, (name, args[0], summary)
            assert f"{path} is not a prl store: {why}" in summary["error"], (name, args[0])
    for path in (tmp_path / "stroe", tmp_path / "empty"):
        assert invoke_json(["inspect", str(path)])[0] == 2
    assert (tree(built["root"]), tree(tmp_path)) == before  # no _locks, no OUT folder, nothing


def test_a_run_without_an_ingest_step_needs_an_existing_store(tmp_path, tokenizer_dir):
    recipe = write_recipe(tmp_path / "r.toml", {"store": {"uri": "stroe"}, "check": {"tokenizer": tokenizer_dir}})
    code, summary = invoke_json(["run", str(recipe)])
    assert code == 2 and "stroe is not a prl store: no such folder" in summary["error"]
    assert tree(tmp_path) == ["r.toml"]


def test_ingest_starts_a_store_only_where_that_buries_nothing(built, tmp_path):
    traces = str(built["data"].root / "traces")
    (tmp_path / "empty").mkdir()
    (tmp_path / "killed" / "_locks").mkdir(parents=True)  # a first ingest killed before its first commit
    (tmp_path / "killed" / "traces").mkdir()
    for fresh in ("new", "empty", "killed"):
        code, summary = invoke_json(["ingest", traces, "--store", str(tmp_path / fresh), "--max-quarantine-rate", "1"])
        assert (code, summary["samples"]) == (0, len(built["data"].good)), fresh
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    code, summary = invoke_json(["ingest", traces, "--store", str(tmp_path / "home")])
    assert code == 2 and "is not a prl store: the folder is not empty (notes.txt)" in summary["error"]
    assert tree(tmp_path / "home") == ["notes.txt"]
    before = tree(built["set_dir"])
    code, summary = invoke_json(["ingest", "--kind", "rewards", traces, "--store", str(built["set_dir"])])
    assert code == 2 and "it holds a shard set" in summary["error"]
    assert tree(built["set_dir"]) == before


def test_s3_prefix_without_tables_is_no_store_and_gets_no_lock(s3, tokenizer_dir):  # noqa: F811
    s3.put("elsewhere/file.txt", b"x")
    code, summary = invoke_json(["check-tokens", "--store", s3.url("store"), "--tokenizer", tokenizer_dir])
    assert code == 2 and f"{s3.url('store')} is not a prl store: no prl table under that prefix" in summary["error"]
    assert invoke_json(["inspect", s3.url("store")])[0] == 2
    assert s3.keys() == ["elsewhere/file.txt"]


@pytest.fixture
def read_only_store(built, tmp_path):
    """A copy of the built store, bind-mounted read-only (needs the right to mount: skipped elsewhere)."""
    source, target = tmp_path / "rw", tmp_path / "ro"
    subprocess.run(["cp", "-a", str(built["root"] / "store"), str(source)], check=True)
    target.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_read_only_store_names_the_read_only_filesystem(read_only_store, built, tokenizer_dir):
    traces = str(built["data"].root / "traces")
    for args in (
        ["ingest", traces, "--store", str(read_only_store)],
        ["check-tokens", "--store", str(read_only_store), "--tokenizer", tokenizer_dir],
    ):
        code, summary = invoke_json(args)
        assert code == 5, summary
        assert f"store {read_only_store} is on a read-only filesystem" in summary["error"]
        assert "guard" not in summary["error"] and "_locks" not in summary["error"]
    code, summary = invoke_json(
        ["check-tokens", "--store", str(read_only_store), "--tokenizer", tokenizer_dir, "--dry-run"]
    )
    assert (code, summary["checked"]) == (0, len(built["data"].good))  # a dry run reads a read-only store
    assert invoke_json(["inspect", str(read_only_store)])[0] == 0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_urls_are_printed_without_userinfo(monkeypatch, tokenizer_dir):
    """An endpoint with credentials in it (``http://user:secret@host``) that cannot be reached: the errors of
    check-tokens and inspect name it without them, in JSON and on stderr."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://alice:s3cr3t@127.0.0.1:{_closed_port()}")
    # one attempt: the endpoint's errors are what is tested, not the retries before them
    credentials = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "v", "AWS_REGION": "us-east-1"}
    for name, value in {**credentials, "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    for args in (
        ["check-tokens", "--store", "s3://bucket-one/store", "--tokenizer", tokenizer_dir],
        ["inspect", "s3://bucket-one/store"],
    ):
        for as_json in (True, False):
            res = runner.invoke(app, [*args, *(["--json"] if as_json else [])])
            assert res.exit_code == 5, res.output
            assert "s3cr3t" not in res.output and "alice" not in res.output
            assert "http://***@127.0.0.1:" in " ".join(res.output.split()).replace("\n", "")
    assert os.environ["AWS_ENDPOINT_URL"].startswith("http://alice:s3cr3t@")  # only the printing changed
