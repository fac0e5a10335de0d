"""docs/cli.md and the key tables of docs/recipes.md are exactly what the definitions say (scripts/gen_docs.py),
and a stale page is caught."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", os.path.join(ROOT, "scripts", "gen_docs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_matches_help():
    module = _gen_docs()
    with open(module.TARGET, encoding="utf-8") as fh:
        assert fh.read() == module.render(), "docs/cli.md is stale: run python scripts/gen_docs.py"
    assert module.stale() == []
    assert module.main(["--check"]) == 0


def test_recipe_tables_are_generated_from_the_models():
    module = _gen_docs()
    with open(module.RECIPES, encoding="utf-8") as fh:
        text = fh.read()
    assert [m.group(2) for m in module.BLOCK.finditer(text)] == [
        "store",
        "ingest",
        "rewards",
        "check",
        "score_ref",
        "maintain",
    ]
    assert "| `sample_rate` | number in (0, 1] | `1.0` |" in text
    assert '| `backend` | `auto`, `vllm`, `sglang` or `tinker` | `"auto"` |' in text
    assert "| `batch_tokens` | integer in [1, 1,073,741,824] | `16384` |" in text
    assert "| `allow_warn` | bool | `true` | `false`: warn verdicts count as problems for `max_drift_rate` |" in text
    assert "| `uri` | path or `s3://` URI | required |" in text


@pytest.mark.parametrize(
    ("page", "old", "new"),
    [
        ("recipes.md", "| `sample_rate` | number in (0, 1] | `1.0` |", "| `sample_rate` | number in (0, 1] | `0.5` |"),
        ("recipes.md", "| `target_mb` | integer in [1, 1,048,576] | `128` |", "| `target_mb` | integer | `128` |"),
        ("cli.md", "| `--format` `STR` |  | `auto` |", "| `--format` `STR` |  | `jsonl` |"),
    ],
)
def test_check_finds_a_stale_page_and_writing_mends_it(tmp_path, monkeypatch, capsys, page, old, new):
    module = _gen_docs()
    copies = {}
    for name, attr in (("cli.md", "TARGET"), ("recipes.md", "RECIPES")):
        copies[name] = tmp_path / name
        shutil.copy(getattr(module, attr), copies[name])
        monkeypatch.setattr(module, attr, str(copies[name]))
    text = copies[page].read_text(encoding="utf-8")
    assert text.count(old) == 1
    copies[page].write_text(text.replace(old, new), encoding="utf-8")
    assert module.stale() == [str(copies[page])]
    assert module.main(["--check"]) == 1
    assert "is stale: run python scripts/gen_docs.py" in capsys.readouterr().err
    assert module.main([]) == 0
    assert copies[page].read_text(encoding="utf-8") == text
    assert module.main(["--check"]) == 0


def _helps(command, path):
    """``(command path, help text)`` of every option and argument under ``command``, subcommands included."""
    for param in command.params:
        if getattr(param, "help", None):
            yield path, param.help
    for name in getattr(command, "commands", {}):
        yield from _helps(command.commands[name], [*path, name])


def test_help_shows_bracketed_words_as_written():
    """Help is plain text: ``[shards]`` and ``prl[ray]`` are not taken for markup and dropped."""
    import typer
    from typer.testing import CliRunner

    from prl.cli import app

    runner = CliRunner()
    shown = " ".join(runner.invoke(app, ["build-shards", "--help"]).output.split())
    assert "TOML recipe; its [shards] table." in shown
    assert "Override one [shards] option: KEY=VALUE (repeatable)." in shown
    assert "(needs prl[ray])" in shown
    bracketed = [(path, text) for path, text in _helps(typer.main.get_command(app), []) if "[" in text]
    assert len(bracketed) >= 5
    for path, text in bracketed:
        output = runner.invoke(app, [*path, "--help"]).output
        assert " ".join(text.split()) in " ".join(output.split()), (path, text)
