"""Rendering of a :class:`prl.maintain.MaintainResult` (one row per table) or an
:class:`~prl.maintain.UpgradeResult`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from prl.maintain import MaintainResult, UpgradeResult


def render(result: MaintainResult | UpgradeResult, console: Console) -> None:
    """Files before → after, compacted / written, vacuumed, and the table version reached; for an upgrade, what
    each table needed."""
    if isinstance(result, UpgradeResult):
        render_upgrade(result, console)
        return
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


def render_upgrade(result: UpgradeResult, console: Console) -> None:
    """The format before → after, then per table the columns added, properties set and event ids filled."""
    title = f"prl maintain --upgrade {result.store}" + ("  (dry run: nothing changes)" if result.dry_run else "")
    table = Table(title=title)
    for column in ("table", "columns added", "properties", "event ids filled", "index"):
        table.add_column(column, justify="left" if column in ("table", "columns added") else "right")
    for t in result.tables:
        table.add_row(
            t.table,
            ", ".join(t.columns_added) or "-",
            "set" if t.properties_set else "-",
            f"{t.event_ids_filled:,}",
            "rebuilt" if t.index_rebuilt else "-",
        )
    if result.tables:
        console.print(table)
    console.print(f"{result.headline()}; {result.seconds:.2f} s")


__all__ = ["render", "render_upgrade"]
