"""Rendering results for people (rich, on stderr-friendly consoles) and machines (one JSON object on stdout)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prl.redact import redact
from prl.text import counted

stdout = Console()
stderr = Console(stderr=True)

WIDE = 1000
"""Columns a report is rendered in when it goes to a file or a pipe (a cron log): wider than any table it holds,
so that nothing is cut or wrapped (tables take only the width they need)."""


def sized(width: int | None = None) -> Console:
    """The stdout console at ``width`` columns; without one, the terminal's width on a terminal (or ``COLUMNS``)
    and :data:`WIDE` anywhere else. (The reports' tables are at least as wide as their titles, which are never
    wrapped when the console has room.)"""
    if width is not None:
        return Console(width=width)
    if stdout.is_terminal or os.environ.get("COLUMNS"):
        return stdout
    return Console(width=WIDE)


def emit_json(payload: dict[str, Any]) -> None:
    """One machine-readable summary on stdout, on one line; credentials removed (:func:`prl.redact.redact`)."""
    sys.stdout.write(redact(json.dumps(payload, sort_keys=True, default=str)) + "\n")
    sys.stdout.flush()


def human_count(n: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:,.0f}{unit}" if unit == "" else f"{n:,.1f}{unit}"
        n /= 1000
    return f"{n:,.1f}T"


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
        counted(len(result.files), "file"),
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


def render_side_ingest(result: Any, console: Console = stdout) -> None:
    """The ``ingest --kind rewards|ref`` summary: one row of counts, then quarantine reasons."""
    table = Table(title=f"prl ingest → {result.store}/{result.table}" + ("  (dry run)" if result.dry_run else ""))
    for column in ("files", "unchanged", "rows written", "already present", "quarantined"):
        table.add_column(column, justify="right")
    table.add_row(
        str(result.files),
        str(result.unchanged_files),
        f"{result.rows:,}",
        f"{result.already_present:,}",
        f"{sum(result.quarantined.values()):,}",
    )
    console.print(table)
    for reason, count in sorted(result.quarantined.items()):
        console.print(f"  quarantined [yellow]{escape(reason)}[/yellow]: {count}")


def render_headline(result: Any, console: Console = stdout) -> None:
    """Any result as its one-line headline (``export``, and commands with nothing more to show)."""
    console.print(escape(result.headline()), highlight=False)


def render_shards(result: Any, console: Console = stdout) -> None:
    """The build-shards summary: shards written, then drops by reason."""
    if getattr(result, "all_dropped", False):
        console.print(f"[red]{escape(result.headline())}[/red]")
    title = f"prl build-shards → {result.set_dir or result.out}  ({result.status})"
    table = Table(title=title)
    for column in ("file", "rows", "tokens", "bytes"):
        table.add_column(column, justify="left" if column == "file" else "right")
    for shard in result.shards:
        table.add_row(shard["file"], f"{shard['rows']:,}", f"{shard['tokens']:,}", f"{shard['bytes']:,}")
    table.add_section()
    table.add_row(counted(len(result.shards), "shard"), f"{result.rows:,}", f"{result.tokens:,}", "")
    console.print(table)
    sets = getattr(result, "sets", [])
    if len(sets) > 1:  # a build in turns (max_set_samples): the table is its last set's
        console.print(f"{len(sets)} sets published in turns (max_set_samples), the last shown above:")
        for entry in sets:
            console.print(
                f"  {entry['set_id']}: {entry['rows']:,} rows, {entry['tokens']:,} tokens, {counted(entry['shards'], 'shard')}"
            )
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
    merged = stats.get("merged_turns")
    if merged:
        console.print(
            f"merged turns: {merged['turns']:,} turns as {merged['rows']:,} rows, {merged['tokens']:,} tokens "
            f"instead of {merged['tokens_unmerged']:,} one row per turn ({merged['saving']:.0%} fewer to read)"
        )


def _short(uri: str, width: int = 60) -> str:
    return uri if len(uri) <= width else "…" + uri[-(width - 1) :]


# --- prl run, inspect, verify ----------------------------------------------------------------------------------
_BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(value: float, top: float, width: int = 40) -> str:
    """A unicode bar of ``width`` cells at full scale ``top`` (eighth-cell resolution)."""
    if top <= 0 or value <= 0:
        return ""
    eighths = round(8 * width * min(value, top) / top)
    full, rest = divmod(eighths, 8)
    return "█" * full + (_BLOCKS[rest] if rest else "")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if float(x).is_integer() and abs(x) < 1e12:
        return f"{int(x):,}"
    return f"{x:.4g}"


def histogram_table(name: str, hist: dict[str, Any], width: int = 40) -> Table:
    """One histogram as rows ``[lo, hi)  count  ███▌`` with a summary in the title (``n=64 (19 unknown)``: the
    samples without a value are counted too)."""
    unknown = hist.get("unknown") or 0
    title = (
        f"{name}: n={hist['count']:,}" + (f" ({unknown:,} unknown)" if unknown else "") + " "
        f"min={_num(hist['min'])} p50={_num(hist['p50'])} "
        f"mean={_num(hist['mean'])} max={_num(hist['max'])}"
    )
    table = Table(title=title, show_header=False, box=None, padding=(0, 1), title_justify="left", min_width=len(title))
    table.add_column("bin", justify="right", style="dim")
    table.add_column("count", justify="right")
    table.add_column("bar")
    edges, counts = hist["edges"], hist["counts"]
    top = max(counts, default=0)
    for lo, hi, count in zip(edges[:-1], edges[1:], counts):
        if hist.get("integer"):
            first, last = round(lo + 0.5), round(hi - 0.5)
            label = f"{first:,}" if first == last else f"{first:,} … {last:,}"
        else:
            label = f"{_num(lo)} … {_num(hi)}"
        table.add_row(label, f"{count:,}", f"[cyan]{bar(count, top, width)}[/cyan]")
    return table


def render_run(result: Any, console: Console = stdout) -> None:
    """One row per step: status, exit code, seconds and the step's headline numbers."""
    title = f"prl run {result.recipe or ''}" + ("  (dry run)" if result.dry_run else "")
    table = Table(title=title, min_width=len(title))
    for column in ("step", "status", "exit", "seconds", "result"):
        table.add_column(column, justify="right" if column in ("exit", "seconds") else "left")
    colors = {"done": "green", "failed": "red", "interrupted": "yellow", "not_run": "dim"}
    for step in result.steps:
        table.add_row(
            step.step,
            f"[{colors.get(step.status, 'white')}]{step.status}[/]",
            str(step.exit_code),
            f"{step.seconds:.2f}",
            escape(step.headline()),
        )
    console.print(table)
    if result.error:
        console.print(f"[red]run stopped:[/red] {escape(result.error)}")
    console.print(f"exit {result.exit_code} after {result.seconds:.2f}s")


def render_inspect(result: Any, console: Console = stdout) -> None:
    if result.kind == "store":
        _render_store(result, console)
    else:
        _render_shard_sets(result, console)


def _counts_table(title: str, rows: list[tuple[str, int]], unit: str, key: str = "value") -> Table:
    table = Table(title=title, title_justify="left", min_width=len(title))
    table.add_column(key)
    table.add_column(unit, justify="right")
    table.add_column("")
    top = max((n for _, n in rows), default=0)
    for value, n in rows:
        table.add_row(value, f"{n:,}", f"[cyan]{bar(n, top, 30)}[/cyan]")
    return table


def _render_store(result: Any, console: Console) -> None:
    title = f"store {result.uri}"
    tables = Table(title=title, title_justify="left", min_width=len(title))
    for column in ("table", "version", "rows", "files", "bytes"):
        tables.add_column(column, justify="left" if column == "table" else "right")
    for name, t in result.tables.items():
        tables.add_row(name, _num(t["version"]), _num(t["rows"]), _num(t["files"]), human_count(t["bytes"]) + "B")
    console.print(tables)
    for column, rows in result.traces_by.items():
        console.print(
            _counts_table(f"traces by {column}", [(str(r["value"]), r["samples"]) for r in rows], "samples", column)
        )
    if result.quarantine:
        rows = [(f"{r['table']}: {r['reason']}", r["records"]) for r in result.quarantine]
        console.print(_counts_table("quarantine by reason", rows, "records", "table: reason"))
    if result.quarantine_superseded:
        console.print(
            f"{result.quarantine_superseded:,} truncated_line records were finished and ingested later "
            "(the rows count, not the quarantine)"
        )
    for check in result.checks:
        v = check["verdicts"]
        console.print(
            f"[bold]checks[/bold] {check['tokenizer_fingerprint'][:16]}: {check['checked']:,} samples — "
            f"ok {v['ok']:,}, note {v.get('note', 0):,}, warn {v['warn']:,}, drift {v['drift']:,}, invalid {v['invalid']:,}; "
            f"drift rate {check['drift_rate']:.2%}, warn rate {check['warn_rate']:.2%}"
        )
        if check["top_reasons"]:
            console.print(_counts_table("  reasons", list(check["top_reasons"].items()), "samples", "reason"))
    if result.rewards:
        rewards = Table(title="rewards by name", title_justify="left")
        for column in ("name", "events", "samples", "mean", "min", "max"):
            rewards.add_column(column, justify="left" if column == "name" else "right")
        for r in result.rewards:
            rewards.add_row(
                r["name"], _num(r["events"]), _num(r["samples"]), _num(r["mean"]), _num(r["min"]), _num(r["max"])
            )
        console.print(rewards)


def _render_shard_sets(result: Any, console: Console) -> None:
    title = f"shard sets in {result.path}"
    sets = Table(title=title, title_justify="left", min_width=len(title))
    sets.add_column("set", no_wrap=True)
    for column in ("rows", "groups", "tokens", "shards", "traces v", "dropped"):
        sets.add_column(column, justify="right")
    for s in result.sets:
        sets.add_row(
            str(s["set_id"]),
            _num(s["rows"]),
            _num(s["groups"]),
            _num(s["tokens"]),
            _num(s["shards"]),
            _num((s["source_versions"] or {}).get("traces")),
            _num(s["dropped"]),
        )
    totals = result.totals
    sets.add_section()
    sets.add_row(
        counted(len(result.sets), "set"),
        _num(totals["rows"]),
        _num(totals["groups"]),
        _num(totals["tokens"]),
        _num(totals["shards"]),
    )
    console.print(sets)
    for s in result.sets:
        console.print(
            f"  {s['set_id']}: advantage {s['advantage']}, kl {s['kl']}, top-k {_num(s['topk'])}, "
            f"current version {_num(s['current_version'])}, groups of one {_num(s['groups_of_one'])}, "
            f"excludes {counted(s['excluded_sets'], 'earlier set')}"
        )
    if result.drops:
        console.print(_counts_table("dropped by reason", list(result.drops.items()), "samples", "reason"))
    for name, hist in result.histograms.items():
        if hist["count"]:
            console.print(histogram_table(name, hist))
        elif hist.get("unknown"):
            console.print(f"{name}: n=0 ({hist['unknown']:,} unknown)")


def render_verify(result: Any, console: Console = stdout) -> None:
    for p in result.problems:
        console.print(f"[red]MISMATCH[/red] {p.set_id}/{p.file}: {p.problem}")
    status = "[green]ok[/green]" if result.ok else f"[red]{len(result.problems)} problem(s)[/red]"
    console.print(
        f"{status}: {counted(len(result.sets), 'set')}, {counted(result.shards, 'shard')}, "
        f"{counted(result.rows, 'row')}, {counted(result.tokens, 'token')}, {human_count(result.bytes)}B verified in {result.path}"
    )
