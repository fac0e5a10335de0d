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
from types import ModuleType
from typing import Annotated, Any

import typer

from prl import bounds
from prl.errors import UsageError
from prl.options import (
    ENGINES,
    CheckTokensOptions,
    IngestOptions,
    MaintainOptions,
    ScoreRefOptions,
    StoreOptions,
    meta,
)
from prl.redact import redact_logging
from prl.report.session import SESSION, PrlGroup, run_command
from prl.results import CommandResult
from prl.runtime import pandas_on_demand, set_process_defaults


def _report() -> ModuleType:
    """:mod:`prl.report.console` (rich), loaded when a command renders its result; ``prl --help`` needs none."""
    from prl.report import console

    return console


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


EngineName = StrEnum("EngineName", [(name, name) for name in ENGINES])  # type: ignore[misc]
"""Where a step's batches run (:data:`prl.options.ENGINES`): click offers and checks these names."""


def _seconds(option: str, maximum: float) -> Any:
    """An option callback: a finite number of seconds in ``(0, maximum]`` (:func:`prl.bounds.check_seconds`;
    click's own float range lets NaN through), else a usage error before the command runs."""

    def check(value: float) -> float:
        try:
            return bounds.check_seconds(option, value, maximum)
        except UsageError as exc:
            raise typer.BadParameter(str(exc)) from None

    return check


def option(model: type, name: str, *, help: str | None = None) -> Any:
    """The ``typer.Option`` of field ``name`` of an options model (:mod:`prl.options`): its flag, its help text
    (``help`` where a command says more) and its range (integers: click's range; seconds: :func:`_seconds`)."""
    spec = meta(model, name)
    assert spec.flag is not None, f"{model.__name__}.{name} has no command-line flag"
    extra: dict[str, Any] = {}
    if spec.kind == "int":
        extra = {"min": spec.minimum, "max": spec.maximum}
    elif spec.kind == "seconds":
        assert spec.maximum is not None
        extra = {"callback": _seconds(spec.flag, spec.maximum)}
    return typer.Option(spec.flag, help=help or spec.help, **extra)


def default(model: type, name: str) -> Any:
    """The command-line default of field ``name``: the model's default (negated for a negated flag such as
    ``--fail-on-warn``)."""
    value = getattr(model, name)
    return not value if meta(model, name).negated_flag else value


EngineOpt = Annotated[EngineName, option(StoreOptions, "engine")]
ENGINE_DEFAULT = EngineName(default(StoreOptions, "engine"))
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one machine-readable JSON summary on stdout.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Do all the reading and checking, write nothing.")]
StoreOpt = Annotated[str, option(StoreOptions, "uri")]


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
    sources: Annotated[list[str], typer.Argument(help=meta(IngestOptions, "sources").help)],
    store: StoreOpt,
    format: Annotated[str, option(IngestOptions, "format")] = default(IngestOptions, "format"),
    kind: Annotated[
        Kind, typer.Option("--kind", help="What the files hold: traces, rewards, or ref (reference logprobs).")
    ] = Kind.traces,
    policy_version: Annotated[str | None, option(IngestOptions, "policy_version")] = default(
        IngestOptions, "policy_version"
    ),
    group_field: Annotated[str | None, option(IngestOptions, "group_field")] = default(IngestOptions, "group_field"),
    finish_reason: Annotated[str | None, option(IngestOptions, "finish_reason")] = default(
        IngestOptions, "finish_reason"
    ),
    agent_field: Annotated[str | None, option(IngestOptions, "agent_field")] = default(IngestOptions, "agent_field"),
    max_quarantine_rate: Annotated[float, option(IngestOptions, "max_quarantine_rate")] = default(
        IngestOptions, "max_quarantine_rate"
    ),
    engine: Annotated[
        EngineName,
        option(
            StoreOptions,
            "engine",
            help="local: this machine; ray: the Ray cluster at RAY_ADDRESS reads the trace files (needs prl[ray]). "
            "Same rows. Rewards and ref files are read here either way.",
        ),
    ] = ENGINE_DEFAULT,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Read serving traces (or rewards / reference logprobs) into the store, exactly as sampled."""
    if kind is not Kind.traces:
        from prl.ingestion.side_tables import ingest_side_table

        run_command(
            lambda: ingest_side_table(sources, store, kind=kind.value, dry_run=dry_run),
            _report().render_side_ingest,
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

    run_command(call, _report().render_ingest, as_json)


@app.command("check-tokens")
def check_tokens_cmd(
    store: StoreOpt,
    tokenizer: Annotated[str, option(CheckTokensOptions, "tokenizer")],
    chat_template: Annotated[str | None, option(CheckTokensOptions, "chat_template")] = default(
        CheckTokensOptions, "chat_template"
    ),
    max_drift_rate: Annotated[float | None, option(CheckTokensOptions, "max_drift_rate")] = default(
        CheckTokensOptions, "max_drift_rate"
    ),
    sample_rate: Annotated[float, option(CheckTokensOptions, "sample_rate")] = default(
        CheckTokensOptions, "sample_rate"
    ),
    fail_on_warn: Annotated[bool, option(CheckTokensOptions, "allow_warn")] = default(CheckTokensOptions, "allow_warn"),
    max_template_timeouts: Annotated[int, option(CheckTokensOptions, "max_template_timeouts")] = default(
        CheckTokensOptions, "max_template_timeouts"
    ),
    engine: EngineOpt = ENGINE_DEFAULT,
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
        lambda r: render(r, _report().stdout),
        as_json,
    )


@app.command("score-ref")
def score_ref_cmd(
    store: StoreOpt,
    ref_model: Annotated[str, option(ScoreRefOptions, "ref_model")],
    endpoint: Annotated[str | None, option(ScoreRefOptions, "endpoint")] = default(ScoreRefOptions, "endpoint"),
    model: Annotated[str | None, option(ScoreRefOptions, "model")] = default(ScoreRefOptions, "model"),
    backend: Annotated[str, option(ScoreRefOptions, "backend")] = default(ScoreRefOptions, "backend"),
    served_model: Annotated[str | None, option(ScoreRefOptions, "served_model")] = default(
        ScoreRefOptions, "served_model"
    ),
    batch_tokens: Annotated[int, option(ScoreRefOptions, "batch_tokens")] = default(ScoreRefOptions, "batch_tokens"),
    concurrency: Annotated[int, option(ScoreRefOptions, "concurrency")] = default(ScoreRefOptions, "concurrency"),
    retries: Annotated[int, option(ScoreRefOptions, "retries")] = default(ScoreRefOptions, "retries"),
    timeout: Annotated[float, option(ScoreRefOptions, "timeout")] = default(ScoreRefOptions, "timeout"),
    max_quarantine_rate: Annotated[float, option(ScoreRefOptions, "max_quarantine_rate")] = default(
        ScoreRefOptions, "max_quarantine_rate"
    ),
    engine: EngineOpt = ENGINE_DEFAULT,
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
        lambda r: render_score(r, _report().stdout),
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
    out: Annotated[str, option(StoreOptions, "out")],
    recipe: Annotated[str | None, typer.Option("--recipe", help="TOML recipe; its [shards] table.")] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override one [shards] option: KEY=VALUE (repeatable).")
    ] = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Ship every sample again, shipped or not.")] = False,
    engine: EngineOpt = ENGINE_DEFAULT,
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
        _report().render_shards,
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

    run_command(call, _report().render_headline, as_json)


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
        lambda: run(recipe, dry_run=dry_run, steps=only), lambda r: _report().render_run(r, _report().sized()), as_json
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

    run_command(lambda: inspect(path), lambda r: _report().render_inspect(r, _report().sized(width)), as_json)


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

    run_command(lambda: verify_shards(shards), _report().render_verify, as_json)


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
    retention_hours: Annotated[int, option(MaintainOptions, "retention_hours")] = default(
        MaintainOptions, "retention_hours"
    ),
    target_mb: Annotated[int, option(MaintainOptions, "target_mb")] = default(MaintainOptions, "target_mb"),
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
    from prl.maintain import maintain
    from prl.maintain import upgrade as upgrade_store
    from prl.report.maintain import render

    def call() -> Any:
        if upgrade:
            return upgrade_store(store, dry_run=dry_run)
        return maintain(store, retention_hours=retention_hours, target_mb=target_mb, tables=table, dry_run=dry_run)

    run_command(call, lambda r: render(r, _report().stdout), as_json)


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
