"""The typed Manifest: what build-shards writes reads back as the same object; a malformed manifest is a clear error
for every reader (verify, inspect, export); the library entry point takes a store path too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prl.errors import UsageError
from prl.export.tinker import export_tinker
from prl.report.inspect import inspect_shards
from prl.shards.build import build_shards
from prl.shards.manifest import MANIFEST, FileEntry, Manifest, ManifestError, existing_sets
from prl.shards.options import ShardOptions
from prl.shards.verify import verify_shards
from tests.shards_fixtures import random_store


@pytest.fixture
def built(tmp_path):
    random_store(str(tmp_path / "store"), 5, 2, with_ref=True)
    options = ShardOptions(kl="advantages", kl_coef=0.2, target_tokens=40)
    result = build_shards(str(tmp_path / "store"), str(tmp_path / "out"), options=options)  # a store path
    assert result.status == "built"
    return result


def test_the_written_manifest_round_trips(built):
    raw = json.loads(Path(built.manifest_path).read_text())
    manifest = Manifest.read(built.set_dir)
    assert manifest.to_json() == raw
    assert Manifest.from_json(json.loads(json.dumps(manifest.to_json()))) == manifest
    assert manifest.set_id == built.set_id and manifest.kl == "advantages" and manifest.topk is None
    assert [e.to_json() for e in manifest.shards] == built.shards
    assert manifest.totals.rows == built.rows == 10 and manifest.totals.shards == len(built.shards)
    assert manifest.samples == FileEntry(
        "sample_ids.arrow", 10, manifest.samples.bytes, manifest.samples.sha256, None, None, None
    )
    assert raw["conventions"]["token_advantages"] == (
        "advantage on loss_mask tokens, 0 elsewhere, plus kl_coef·(mean_log_ratio − d_t) on valid tokens"
    )
    assert existing_sets(str(Path(built.set_dir).parent)) == [manifest]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.pop("set_id"), "missing 'set_id'"),
        (lambda m: m["totals"].pop("tokens"), "totals: missing 'tokens'"),
        (lambda m: m["shards"][0].update(rows="3"), r"shards\[0\]: 'rows' has the wrong type \(str\)"),
        (lambda m: m["shards"][0].update(bytes=True), r"shards\[0\]: 'bytes' has the wrong type \(bool\)"),
        (lambda m: m.update(format="other"), "format 'other' is not 'prl.shards'"),
        (lambda m: m.update(source=[]), "'source' has the wrong type"),
    ],
)
def test_a_malformed_manifest_names_the_key(built, change, message):
    raw = json.loads(Path(built.manifest_path).read_text())
    change(raw)
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(raw)
    Path(built.manifest_path).write_text(json.dumps(raw))
    problems = verify_shards(built.set_dir).problems
    assert [(p.file, p.problem.split(":")[0]) for p in problems] == [(MANIFEST, "unreadable")]
    with pytest.raises(UsageError, match=message):
        export_tinker(built.set_dir, str(Path(built.set_dir).parent / "d.jsonl"))
    with pytest.raises(ManifestError, match=message):
        inspect_shards(built.set_dir)


def test_a_manifest_that_is_not_json(built):
    Path(built.manifest_path).write_text("{")
    with pytest.raises(ManifestError, match="not JSON"):
        Manifest.read(built.set_dir)
    with pytest.raises(ManifestError, match="expected a JSON object"):
        Manifest.from_json([])
    assert verify_shards(built.set_dir).problems[0].problem.startswith("unreadable: ")
