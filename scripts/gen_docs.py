"""Write the option reference from the options' own definitions: docs/cli.md from the commands (the text ``--help``
shows, whose flags, help and defaults come from the options models of :mod:`prl.options`), and the key tables of
docs/recipes.md (between ``<!-- options: TABLE -->`` and ``<!-- /options -->``) from the same models.

Run ``python scripts/gen_docs.py`` after changing an option; ``--check`` (run by ``make lint``, and by
``tests/test_cli_reference.py``) writes nothing and exits 1 naming each stale file."""

from __future__ import annotations

import argparse
import enum
import json
import os
import re
import sys
from dataclasses import MISSING, fields
from typing import Any

import typer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "docs", "cli.md")
RECIPES = os.path.join(ROOT, "docs", "recipes.md")
BLOCK = re.compile(r"(<!-- options: (\w+) -->\n)(.*?)(<!-- /options -->)", re.S)


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
    """The value's type as ``--help`` names it: the choices of an enum, ``LIST`` for a repeatable option, else the
    type's name (a bounded integer is ``INT``: its range is in the recipe reference)."""
    kind = param.type
    choices = getattr(kind, "choices", None)
    if choices:
        return "\\|".join(str(choice) for choice in choices)  # a table cell: pipes escaped
    if getattr(param, "multiple", False):
        return "LIST"
    return "INT" if type(kind).__name__ == "IntRange" else kind.name.upper()


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
        "Generated from the commands' definitions (what `--help` shows) by `python scripts/gen_docs.py`; `make lint`",
        "fails when this page and the commands drift apart. Exit codes: see the README.",
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


def _default_text(value: object, doc_default: str | None) -> str:
    if doc_default is not None:
        return doc_default
    if value is MISSING:
        return "required"
    if value is None:
        return "none"
    return f"`{json.dumps(value)}`"


def recipe_table(table: str) -> str:
    """The key table of recipe table ``table`` (``[rewards]`` and ``[ref]`` share one), from its options model."""
    from prl.options import meta
    from prl.pipeline.recipe import TABLES

    model = TABLES[table]
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in fields(model):
        spec = meta(model, f.name)
        default = _default_text(f.default, spec.doc_default)
        lines.append(f"| `{f.name}` | {spec.type_text()} | {default} | {_cell(spec.doc or spec.help)} |")
    return "\n".join(lines) + "\n"


def render_recipes(text: str) -> str:
    """docs/recipes.md ``text`` with every generated block written again."""
    return BLOCK.sub(lambda m: m.group(1) + recipe_table(m.group(2)) + m.group(4), text)


def outputs() -> dict[str, str]:
    """Each generated file and what it should hold."""
    with open(RECIPES, encoding="utf-8") as fh:
        recipes = fh.read()
    return {TARGET: render(), RECIPES: render_recipes(recipes)}


def stale() -> list[str]:
    """The generated files whose text differs from what the definitions say."""
    out = []
    for path, text in outputs().items():
        with open(path, encoding="utf-8") as fh:
            if fh.read() != text:
                out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for path in old:
            sys.stderr.write(f"{os.path.relpath(path, ROOT)} is stale: run python scripts/gen_docs.py\n")
        return 1 if old else 0
    for path, text in outputs().items():
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        sys.stdout.write(f"wrote {os.path.relpath(path, ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
