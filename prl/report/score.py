"""Rendering of a ``prl score-ref`` result (:class:`prl.score.run.ScoreResult`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def render_score(result: Any, console: Console) -> None:
    """One table: samples scored and quarantined, tokens, throughput; then the quarantine reasons."""
    title = f"prl score-ref {escape(result.ref_model)} ({result.backend}) → {escape(result.store)}/ref_logprobs"
    table = Table(title=title + ("  (dry run)" if result.dry_run else ""))
    for column in ("missing", "scored", "quarantined", "batches", "input tokens", "tokens/s"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{result.candidates:,}",
        "-" if result.dry_run else f"{result.scored:,}",
        f"{sum(result.quarantined.values()):,}",
        f"{result.batches:,}",
        f"{result.input_tokens:,}",
        "-" if result.dry_run else f"{result.tokens_per_second:,.0f}",
    )
    console.print(table)
    console.print(f"source: {escape(result.source)}")
    for reason, count in sorted(result.quarantined.items()):
        console.print(f"  quarantined [yellow]{reason}[/yellow]: {count}")


def headline(summary: dict[str, Any]) -> str:
    """The ``prl run`` table's one-line summary of a ``score_ref`` step."""
    return (
        f"{summary.get('scored', 0):,} of {summary.get('candidates', 0):,} missing samples scored "
        f"({summary.get('ref_model')}, {summary.get('backend')}), "
        f"{sum((summary.get('quarantined') or {}).values()):,} quarantined, "
        f"{summary.get('tokens_per_second', 0):,.0f} tokens/s"
    )
