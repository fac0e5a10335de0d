"""Rendering results for people (rich, on stderr-friendly consoles) and machines (one JSON object on stdout)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

stdout = Console()
stderr = Console(stderr=True)


def emit_json(payload: dict[str, Any]) -> None:
    """One machine-readable summary on stdout."""
    sys.stdout.write(json.dumps(payload, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def human_count(n: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:,.0f}{unit}" if unit == "" else f"{n:,.1f}{unit}"
        n /= 1000
    return f"{n:,.1f}T"


@contextmanager
def byte_progress(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A progress bar over ``total`` bytes, only when stderr is a terminal; yields the advance callback
    (or None)."""
    if not stderr.is_terminal or total <= 0:
        yield None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=stderr, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda advanced: progress.advance(task, advanced)


def ingest_table(result: Any) -> Table:
    """The ingest summary: one row per file, then totals and quarantine reasons."""
    table = Table(title=f"prl ingest → {result.store}" + ("  (dry run)" if result.dry_run else ""))
    for column in ("file", "format", "status", "records", "samples", "tokens", "quarantined"):
        table.add_column(
            column, justify="right" if column in ("records", "samples", "tokens", "quarantined") else "left"
        )
    for f in result.files:
        quarantined = sum(f.quarantined.values())
        table.add_row(
            _short(f.uri),
            f.format or "-",
            f.status if not f.error else f"[red]{f.status}[/red]",
            f"{f.records:,}",
            f"{f.samples:,}",
            f"{f.prompt_tokens + f.completion_tokens:,}",
            f"[yellow]{quarantined:,}[/yellow]" if quarantined else "0",
        )
    table.add_section()
    table.add_row(
        f"{len(result.files)} files",
        "",
        "",
        f"{result.records:,}",
        f"{result.samples:,}",
        f"{result.tokens:,}",
        f"{result.quarantined_total:,}",
    )
    return table


def render_ingest(result: Any, console: Console = stdout) -> None:
    console.print(ingest_table(result))
    for f in result.files:
        if f.error:
            console.print(f"[red]error[/red] {f.error}")
    if result.quarantined:
        reasons = Table(title="quarantined by reason")
        reasons.add_column("reason")
        reasons.add_column("records", justify="right")
        for reason, count in sorted(result.quarantined.items(), key=lambda kv: -kv[1]):
            reasons.add_row(reason, f"{count:,}")
        console.print(reasons)
    rate = result.tokens / result.seconds if result.seconds else 0.0
    console.print(
        f"{result.samples:,} samples ({human_count(result.tokens)} tokens) written, "
        f"{result.already_present:,} already present, {result.quarantined_total:,} quarantined "
        f"({result.quarantine_rate:.2%}); {human_count(result.bytes_read)}B read in {result.seconds:.2f}s "
        f"({human_count(rate)} tokens/s); table versions {result.versions}"
    )


def render_shards(result: Any, console: Console = stdout) -> None:
    """The build-shards summary: shards written, then drops by reason."""
    title = f"prl build-shards → {result.set_dir or result.out}  ({result.status})"
    table = Table(title=title)
    for column in ("file", "rows", "tokens", "bytes"):
        table.add_column(column, justify="left" if column == "file" else "right")
    for shard in result.shards:
        table.add_row(shard["file"], f"{shard['rows']:,}", f"{shard['tokens']:,}", f"{shard['bytes']:,}")
    table.add_section()
    table.add_row(f"{len(result.shards)} shards", f"{result.rows:,}", f"{result.tokens:,}", "")
    console.print(table)
    if result.drops:
        reasons = Table(title="dropped by reason")
        reasons.add_column("reason")
        reasons.add_column("samples", justify="right")
        for reason, count in sorted(result.drops.items(), key=lambda kv: -kv[1]):
            reasons.add_row(reason, f"{count:,}")
        console.print(reasons)
    stats = result.statistics
    console.print(
        f"{result.considered:,} considered, {result.already_shipped:,} already shipped, "
        f"{sum(result.drops.values()):,} dropped; groups of one: {stats.get('groups_of_one', 0):,} "
        f"({stats.get('groups_of_one_fell_back', 0):,} fell back to '{stats.get('singleton_baseline', '-')}'); "
        f"source versions {result.source_versions}"
    )


def _short(uri: str, width: int = 60) -> str:
    return uri if len(uri) <= width else "…" + uri[-(width - 1) :]
