"""Rendering of a :class:`prl.store.maintain.MaintainResult`: one row per table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from prl.store.maintain import MaintainResult


def render(result: MaintainResult, console: Console) -> None:
    """Files before → after, compacted / written, vacuumed, and the table version reached."""
    title = f"prl maintain {result.store}" + ("  (dry run: vacuum lists, nothing changes)" if result.dry_run else "")
    table = Table(title=title)
    for column in ("table", "files", "compacted", "written", "vacuumed", "version"):
        table.add_column(column, justify="left" if column == "table" else "right")
    for t in result.tables:
        table.add_row(
            t.table,
            f"{t.files_before:,} → {t.files_after:,}",
            f"{t.files_compacted:,}",
            f"{t.files_written:,}",
            f"{t.files_vacuumed:,}",
            f"{t.version_before} → {t.version_after}",
        )
    console.print(table)
    console.print(f"retention {result.retention_hours} h; {result.seconds:.2f} s")


__all__ = ["render"]
