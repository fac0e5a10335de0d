"""The build-shards and export commands: thin layers over the library."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from prl.cli import app
from prl.store.tables import Store
from tests.shards_fixtures import commit_traces, grouped_rows, random_store

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


def test_a_build_in_turns_reports_every_set_and_export_takes_them_all(tmp_path):
    store = Store(str(tmp_path / "s"))
    for i in range(4):
        commit_traces(store, grouped_rows(f"c{i}", 2, 2), refs=False)
    args = ["build-shards", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "o")]
    res = runner.invoke(app, [*args, "--set", "max_set_samples=4", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert (summary["status"], summary["rows"], [s["rows"] for s in summary["sets"]]) == ("built", 16, [4, 4, 4, 4])
    assert summary["set_id"] == summary["sets"][-1]["set_id"] and summary["pending_files"] == 0
    exp = runner.invoke(app, ["export", str(tmp_path / "o"), str(tmp_path / "d.jsonl"), "--json"])
    assert exp.exit_code == 0 and json.loads(exp.stdout)["rows"] == 16
    human = runner.invoke(app, ["build-shards", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "h")])
    assert human.exit_code == 0 and "sets published in turns" not in human.output
    capped = runner.invoke(
        app,
        ["build-shards", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "t"), "--set", "max_set_samples=8"],
    )
    assert capped.exit_code == 0 and "2 sets published in turns (max_set_samples)" in capped.output
    one = runner.invoke(app, [*args[:-1], str(tmp_path / "n"), "--set", "max_set_samples=none", "--json"])
    assert [s["rows"] for s in json.loads(one.stdout)["sets"]] == [16]
