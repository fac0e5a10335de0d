"""docs/cli.md is exactly what the commands' --help says."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cli_reference_matches_help():
    spec = importlib.util.spec_from_file_location("cli_reference", os.path.join(ROOT, "scripts", "cli_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(module.TARGET, encoding="utf-8") as fh:
        assert fh.read() == module.render(), "docs/cli.md is stale: run python scripts/cli_reference.py"


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
