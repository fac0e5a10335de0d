"""Rendering of ``prl shards list``: one part file per line, so the output feeds other tools as it is."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from prl.report.console import stdout


def render_shard_list(result: Any, console: Console = stdout) -> None:
    """Print every part file of the current complete sets, one absolute path per line, in set and part order."""
    for path in result.files:
        console.print(path, markup=False, highlight=False, soft_wrap=True)
