"""Rendering a :class:`~prl.checks.result.CheckResult` with rich: rate tables, and for the worst samples the
two token sequences decoded piece by piece around the first divergence, so a person sees why."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from prl.checks.result import CheckResult, Example
from prl.verdicts import REASONS

VERDICT_STYLE = {"ok": "green", "note": "cyan", "warn": "yellow", "drift": "red", "invalid": "bold red"}

SEQUENCE_LABELS = {
    "reencoded": "re-encoded",
    "rendered": "template",
    "previous": "previous turn",
}


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.2f}%" if total else "-"


def format_pieces(pairs: list[list[Any]], start: int, mark: int | None) -> Text:
    """``[  1520 'Hello'][  2058 ' world']``; the token at position ``mark`` is highlighted."""
    out = Text()
    for i, (tid, piece) in enumerate(pairs):
        style = "bold reverse" if mark is not None and start + i == mark else ""
        out.append(f"[{tid:>6} {piece!r}]", style=style)
    return out


def example_panel(ex: Example) -> Panel:
    """One worst sample: reasons and, when there is evidence, the aligned token windows."""
    head = Text()
    head.append(ex.verdict, style=VERDICT_STYLE.get(ex.verdict, ""))
    head.append(f"  {', '.join(ex.reasons)}")
    if ex.first_divergence is not None:
        head.append(f"  at {ex.first_divergence}")
    parts: list[Any] = [head]
    evidence = ex.detail.get("evidence") or {}
    if "ids" in evidence:
        start = int(evidence.get("window_start", 0))
        where = evidence.get("where", "")
        parts.append(Text(f"{where} tokens from position {start}:", style="dim"))
        parts.append(format_pieces(evidence["ids"], start, ex.first_divergence))
        for key, label in SEQUENCE_LABELS.items():
            if key in evidence:
                parts.append(Text(f"{label}:", style="dim"))
                parts.append(format_pieces(evidence[key], start, ex.first_divergence))
    if "template_error" in ex.detail:
        parts.append(Text(f"template error: {ex.detail['template_error']}", style="yellow"))
    return Panel(Group(*parts), title=ex.sample_id, title_align="left")


def render(result: CheckResult, console: Console | None = None) -> None:
    """Print the summary tables and the worst examples."""
    console = console or Console(stderr=False)
    total = result.checked
    summary = Table(title="check-tokens", show_header=False)
    summary.add_row("store", result.store)
    summary.add_row("tokenizer", f"{result.tokenizer}  ({result.fingerprint[:12]})")
    summary.add_row("chat template", "yes" if result.template else "none: template check skipped")
    summary.add_row(
        "checked", f"{total}  (already checked: {result.skipped_existing}, sampled out: {result.sampled_out})"
    )
    for verdict, n in result.verdicts.items():
        summary.add_row(Text(verdict, style=VERDICT_STYLE[verdict]), f"{n}  ({_pct(n, total)})")
    threshold = "none" if result.max_drift_rate is None else f"{100 * result.max_drift_rate:.2f}%"
    summary.add_row("drift rate", f"{100 * result.drift_rate:.2f}%  (threshold {threshold})")
    if result.tokens:
        shared = 1.0 - result.tokens_roundtripped / result.tokens
        summary.add_row("tokens", f"{result.tokens}  ({100 * shared:.1f}% answered from shared segments)")
    summary.add_row("elapsed", f"{result.elapsed_s:.2f} s")
    summary.add_row("exit code", str(result.exit_code))
    console.print(summary)

    checks = Table(title="samples flagged per check")
    checks.add_column("check")
    checks.add_column("samples", justify="right")
    checks.add_column("rate", justify="right")
    for name, n in result.checks.items():
        checks.add_row(name, str(n), _pct(n, total))
    console.print(checks)

    if result.reasons:
        reasons = Table(title="reasons")
        reasons.add_column("reason")
        reasons.add_column("verdict")
        reasons.add_column("samples", justify="right")
        reasons.add_column("rate", justify="right")
        for code, n in sorted(result.reasons.items(), key=lambda kv: -kv[1]):
            verdict = REASONS[code][1]
            reasons.add_row(code, Text(verdict, style=VERDICT_STYLE[verdict]), str(n), _pct(n, total))
        console.print(reasons)

    if any(result.prefix.values()):
        prefix = Table(title="multi-turn prefix")
        for status in result.prefix:
            prefix.add_column(status, justify="right")
        prefix.add_row(*(str(n) for n in result.prefix.values()))
        console.print(prefix)

    rates = result.group_rates()
    for column, values in result.groups.items():
        if not values:
            continue
        table = Table(title=f"by {column}")
        table.add_column(column)
        for name in ("checked", "ok", "note", "warn", "drift", "invalid"):
            table.add_column(name, justify="right")
        table.add_column("drift rate", justify="right")
        for value, counts in sorted(values.items()):
            table.add_row(
                value,
                *(str(counts.get(k, 0)) for k in ("checked", "ok", "note", "warn", "drift", "invalid")),
                f"{100 * rates[column][value]:.2f}%",
            )
        console.print(table)

    for ex in result.worst:
        console.print(example_panel(ex))
