"""``prl verify``: every shard's sha256, size, rows and tokens against its manifest; each mismatch named."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.errors import UsageError
from prl.shards.build import build_shards
from prl.shards.layout import meta_root
from prl.shards.options import ShardOptions
from prl.shards.verify import verify_shards
from tests.shards_fixtures import random_store

runner = CliRunner()


@pytest.fixture
def built(tmp_path):
    store = random_store(str(tmp_path / "s"), n_groups=5, group_size=2, seed=7)
    result = build_shards(store, str(tmp_path / "out"), options=ShardOptions(target_tokens=30))
    assert len(result.shards) >= 3
    return result


def problems(path) -> list[tuple[str, str]]:
    return [(p.file, p.problem.split(" ")[0]) for p in verify_shards(str(path)).problems]


def test_intact_set_and_out_folder(built, tmp_path):
    one = verify_shards(built.set_dir)
    assert one.ok and one.exit_code == 0
    assert (one.rows, one.tokens, one.shards) == (10, built.tokens, len(built.shards))
    assert one.bytes == sum(s["bytes"] for s in built.shards)
    assert verify_shards(str(tmp_path / "out")).to_json()["sets"] == [built.set_id]


def test_flipped_byte_is_a_sha256_mismatch_naming_the_shard(built):
    victim = f"{built.set_dir}/{built.shards[1]['file']}"
    with open(victim, "rb") as fh:
        data = bytearray(fh.read())
    data[len(data) // 2] ^= 0xFF
    with open(victim, "wb") as fh:
        fh.write(bytes(data))
    assert problems(built.set_dir) == [(built.shards[1]["file"], "sha256")]
    res = runner.invoke(app, ["verify", built.set_dir])
    assert res.exit_code == 1
    assert f"{built.set_id}/{built.shards[1]['file']}" in res.stdout


def test_missing_truncated_and_leftover_files(built):
    shutil.move(f"{built.set_dir}/{built.shards[0]['file']}", f"{built.set_dir}/{built.shards[0]['file']}.tmp")
    with open(f"{built.set_dir}/{built.shards[2]['file']}", "ab") as fh:
        fh.write(b"x")
    assert sorted(problems(built.set_dir)) == sorted(
        [
            (f"{built.shards[0]['file']}.tmp", "leftover"),
            (built.shards[0]["file"], "missing"),
            (built.shards[2]["file"], "size"),
        ]
    )


def test_manifest_counts_are_recomputed(built):
    path = built.manifest_path
    with open(path) as fh:
        manifest = json.load(fh)
    manifest["shards"][0]["rows"] += 1
    manifest["shards"][1]["tokens"] -= 2
    with open(path, "w") as fh:
        json.dump(manifest, fh)
    assert problems(built.set_dir) == [(built.shards[0]["file"], "rows"), (built.shards[1]["file"], "tokens")]
    result = runner.invoke(app, ["verify", built.set_dir, "--json"])
    summary = json.loads(result.stdout)
    assert result.exit_code == summary["exit_code"] == 1 and not summary["ok"]


def test_a_sample_in_two_sets_is_reported(built, tmp_path):
    shutil.copytree(built.set_dir, tmp_path / "out" / "v9-copy")
    shutil.copytree(os.path.dirname(built.manifest_path), Path(meta_root(tmp_path / "out")) / "sets" / "v9-copy")
    found = verify_shards(str(tmp_path / "out")).problems
    assert found[0].file == "manifest.json" and f"set_id {built.set_id!r} != folder name" in found[0].problem
    twice, index = found[1:-1], found[-1]
    assert len(twice) == 10  # every sample of the copy, each named once (the copy sorts after the original)
    assert (index.set_id, index.file) == ("meta", "index.json")  # the copy is no line of the index
    assert {p.set_id for p in twice} == {"v9-copy"}
    assert all(p.problem.endswith(f"shipped in {built.set_id}, v9-copy") for p in twice)


def test_not_a_shard_set(tmp_path):
    with pytest.raises(UsageError, match="holds no shard set"):
        verify_shards(str(tmp_path))
    with pytest.raises(UsageError, match="is not a shard set"):
        verify_shards(str(tmp_path / "nope"))


def test_an_out_whose_index_is_not_its_manifests_is_reported(built, tmp_path):
    out = tmp_path / "out"
    index = Path(meta_root(out)) / "index.json"
    lines = json.loads(index.read_text())
    assert problems(out) == []
    edited = {**lines, "sets": [{**lines["sets"][0], "rows": lines["sets"][0]["rows"] + 1}]}
    index.write_text(json.dumps(edited))
    assert problems(out) == [("index.json", "not")]
    assert problems(built.set_dir) == []  # one set: no index to check
    index.write_text("{garbage")
    assert problems(out) == [("index.json", "not")]
    index.unlink()
    found = verify_shards(str(out)).problems
    assert [(p.set_id, p.file, p.problem) for p in found] == [
        ("meta", "index.json", "missing: the next build that publishes a set writes it")
    ]
    res = runner.invoke(app, ["verify", str(out)])
    assert res.exit_code == 1 and "MISMATCH meta/index.json: missing" in res.stdout
