"""Write docs/cli.md from the commands' own definitions (the text ``--help`` shows):
``tests/test_cli_reference.py`` fails when the two drift; run ``python scripts/cli_reference.py`` after changing an
option."""

from __future__ import annotations

import enum
import os
import sys
from typing import Any

import typer

TARGET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "cli.md")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _usage(command: Any) -> str:
    """``[OPTIONS] SOURCES...``: arguments by name (optional ones in brackets), as a user types them."""
    pieces = ["[OPTIONS]"] if any(p.param_type_name == "option" and p.name != "help" for p in command.params) else []
    for param in command.params:
        if param.param_type_name != "argument":
            continue
        name = param.name.upper() + ("..." if param.nargs == -1 else "")
        pieces.append(name if param.required else f"[{name}]")
    return " ".join(pieces)


def _type_name(param: Any) -> str:
    annotation = param.type_descriptor.annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "\\|".join(str(member.value) for member in annotation)  # a table cell: pipes escaped
    return getattr(annotation, "__name__", str(annotation)).upper()


def _param_row(param: Any) -> str:
    if param.param_type_name == "argument":
        name = f"`{param.name.upper()}`" + (" …" if param.nargs == -1 else "")
        help_text = getattr(param, "help", "") or ""
    else:
        name = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
        if not param.is_flag:
            name += f" `{_type_name(param)}`"
        help_text = param.help or ""
    default = param.default.value if isinstance(param.default, enum.Enum) else param.default
    shown = "" if default is None or param.required or default is False or default == () else f"`{default}`"
    return f"| {name} | {'yes' if param.required else ''} | {shown} | {_cell(help_text)} |"


def render() -> str:
    from prl.cli import app

    group = typer.main.get_command(app)
    context = type(group.make_context("prl", ["--help"], resilient_parsing=True))
    ctx = context(group, info_name="prl")
    lines = [
        "# Command-line reference",
        "",
        "Generated from the commands' definitions (what `--help` shows) by `python scripts/cli_reference.py`; a",
        "test fails when this page and the commands drift apart. Exit codes: see the README.",
        "",
        "Long work shows its progress on stderr (stdout keeps the `--json` object alone): on a terminal a bar (ingest:",
        "bytes and files; check-tokens and score-ref: samples; build-shards: shards and turns), elsewhere (cron, a pipe)",
        "one log line every 10 seconds (`PRL_PROGRESS_INTERVAL` seconds) with the rate and the time left, and one",
        "when it ends; work shorter than that logs nothing.",
        "",
        f"`prl [--verbose] COMMAND …` — {_cell(group.help or '')}",
    ]
    commands = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if hasattr(command, "list_commands"):  # a command group (``prl shards …``): its subcommands
            sub_ctx = context(command, info_name=name, parent=ctx)
            commands += [(f"{name} {sub}", command.get_command(sub_ctx, sub)) for sub in command.list_commands(sub_ctx)]
        else:
            commands.append((name, command))
    for name, command in commands:
        assert command is not None
        usage = _usage(command)
        lines += ["", f"## prl {name}", "", f"`prl {name} {usage}`", "", _cell(command.help or ""), ""]
        lines += ["| argument / option | required | default | meaning |", "|---|---|---|---|"]
        lines += [_param_row(p) for p in command.params if p.name != "help"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with open(TARGET, "w", encoding="utf-8") as fh:
        fh.write(render())
    sys.stdout.write(f"wrote {TARGET}\n")
