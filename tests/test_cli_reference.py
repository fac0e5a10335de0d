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
