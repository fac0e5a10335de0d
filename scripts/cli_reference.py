"""Write docs/cli.md from ``prl --help`` and each command's ``--help`` (``tests/test_cli_reference.py`` fails when
the two drift: run ``python scripts/cli_reference.py`` after changing an option)."""

from __future__ import annotations

import os
import sys

WIDTH = "100"
COMMANDS = ["ingest", "check-tokens", "build-shards", "export", "run", "inspect", "verify"]
TARGET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "cli.md")


def help_text(args: list[str]) -> str:
    """The help screen of ``prl ARGS --help`` at a fixed width, trailing spaces removed."""
    from typer.testing import CliRunner

    from prl.cli import app

    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": WIDTH, "TERM": "dumb", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return "\n".join(line.rstrip() for line in result.output.strip("\n").splitlines())


def render() -> str:
    parts = [
        "# Command-line reference",
        "",
        "Generated from `--help` by `python scripts/cli_reference.py`; a test fails when this page and the",
        "commands drift apart.",
        "",
        "```",
        help_text([]),
        "```",
    ]
    for command in COMMANDS:
        parts += ["", f"## prl {command}", "", "```", help_text([command]), "```"]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    with open(TARGET, "w", encoding="utf-8") as fh:
        fh.write(render())
    sys.stdout.write(f"wrote {TARGET}\n")
