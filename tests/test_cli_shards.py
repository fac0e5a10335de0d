"""The build-shards and export commands: thin layers over the library."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from prl.cli import app
from tests.shards_fixtures import random_store

runner = CliRunner()


def test_build_shards_and_export(tmp_path):
    random_store(str(tmp_path / "s"), 4, 2)
    recipe = tmp_path / "r.toml"
    recipe.write_text('[shards]\nadvantage = "loo"\ntarget_tokens = 50\n')
    args = ["build-shards", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--recipe", str(recipe)]
    res = runner.invoke(app, [*args, "--set", "seed=3", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["status"] == "built" and summary["rows"] == 8
    again = runner.invoke(app, [*args, "--json"])
    assert json.loads(again.stdout)["status"] == "nothing_new"
    exp = runner.invoke(app, ["export", summary["set_dir"], str(tmp_path / "d.jsonl"), "--json"])
    assert exp.exit_code == 0 and json.loads(exp.stdout)["rows"] == 8
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 8


def test_bad_override_is_usage_error(tmp_path):
    res = runner.invoke(
        app, ["build-shards", "--store", str(tmp_path), "--out", str(tmp_path / "o"), "--set", "kl=maybe"]
    )
    assert res.exit_code == 2
    res = runner.invoke(app, ["export", str(tmp_path), str(tmp_path / "x.jsonl"), "--format", "hf"])
    assert res.exit_code == 2
