"""One command line's output contract: under ``--json`` exactly one JSON object reaches stdout, its
``exit_code`` equal to the process's, whatever ended the command (a result, an error, a usage error that click
raised before any command ran, an interrupt). :mod:`prl.cli` builds its typer app on :class:`PrlGroup` and runs
every command's library call through :func:`run_command`.

The consoles (:mod:`prl.report.console`, rich) load when a command first prints, not before: ``prl --help`` needs
none of them."""

from __future__ import annotations

import gc
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from prl import progress
from prl.errors import ExitCode, PrlError, RetryableIOError
from prl.redact import redact
from prl.results import CommandResult, ErrorResult

try:  # typer ≥ 0.20 parses with its own copy of click
    from typer._click.exceptions import ClickException as _ClickException
except ImportError:  # pragma: no cover - older typer parses with click itself
    from click import ClickException as _ClickException  # type: ignore[assignment]


class PrlGroup(TyperGroup):
    """The ``prl`` group: every way a command line ends goes through :meth:`main`, so that under ``--json``
    exactly one JSON object reaches stdout, its ``exit_code`` equal to the process's, including usage errors
    that click raises before any command runs (missing option, unknown flag, bad value) and interrupts."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        SESSION.start(argv)
        try:
            code = super().main(argv, prog_name or "prl", complete_var, standalone_mode=False, **extra)
        except _ClickException as exc:  # parsing failed: nothing ran
            code = _usage_error(exc)
        except (typer.Abort, KeyboardInterrupt):
            code = _finish(ErrorResult(SESSION.command, "interrupted", int(ExitCode.INTERRUPTED)), None)
        code = SESSION.close(int(code or 0))
        if standalone_mode:
            sys.exit(code)
        return code


class _Session:
    """What one command line asked (``--json``, the command's name) and whether its JSON object went out."""

    def __init__(self) -> None:
        self.start([])
        self.quiet_signals = False
        """Set by :func:`main` (a real process): once the summary is printed, signals no longer interrupt."""

    def start(self, argv: list[str]) -> None:
        head = argv[: argv.index("--")] if "--" in argv else argv
        self.as_json = "--json" in head
        self.command = next((a for a in head if not a.startswith("-")), "prl")
        self.emitted: int | None = None

    def emit(self, payload: dict[str, Any]) -> None:
        if self.emitted is not None:
            return
        if self.quiet_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.emitted = int(payload["exit_code"])
        from prl.report import console as report

        report.emit_json(payload)

    def close(self, code: int) -> int:
        """The process's exit code; under ``--json`` the one object is printed now if nothing printed it
        (help and ``--version`` print text and exit 0)."""
        if self.emitted is not None:
            return self.emitted
        if self.as_json and code != 0:
            error = "interrupted" if code == ExitCode.INTERRUPTED else f"exit {code}"
            self.emit(ErrorResult(self.command, error, code).to_json())
        return code


SESSION = _Session()


def _usage_error(exc: Any) -> int:
    """A command line that did not parse: exit 2, whatever click's own code for the error. (With no command at
    all, the help was printed already and the error has no message.)"""
    from rich.markup import escape

    from prl.report import console as report

    message = exc.format_message()
    context = getattr(exc, "ctx", None)
    if message and context is not None:
        report.stderr.print(escape(context.get_usage()), highlight=False)
        report.stderr.print(f"Try '{escape(context.command_path)} --help' for help.", highlight=False)
    result = ErrorResult(SESSION.command, message or "no command given", int(ExitCode.USAGE))
    if not message:
        if SESSION.as_json:
            SESSION.emit(result.to_json())
        return result.exit_code
    return _finish(result, None)


def _finish(result: CommandResult, render: Callable[[Any], None] | None) -> int:
    """Print ``result`` (its JSON object under ``--json``, else ``render`` or, for errors, a line on stderr)
    and return its exit code."""
    from rich.markup import escape

    from prl.report import console as report

    code = int(result.exit_code)
    if SESSION.as_json:
        SESSION.emit(result.to_json())
    if isinstance(result, ErrorResult):
        if result.error == "interrupted":
            report.stderr.print("[yellow]interrupted[/yellow]: committed work is kept, uncommitted work is invisible")
        else:
            report.stderr.print(f"[red]error:[/red] {escape(result.error)}", highlight=False)
    elif not SESSION.as_json and render is not None:
        render(result)
    return code


def run_command(call: Callable[[], CommandResult], render: Callable[[Any], None], as_json: bool) -> None:
    """Run a library call, print its result, exit with its exit code; errors become an :class:`ErrorResult`
    (an ``OSError`` that no layer below translated is retryable I/O: exit 5; an interrupt is 130).

    The modules imported by now (the command's library) live as long as this process: they are moved out of
    the cyclic garbage collector's reach first (``gc.freeze``), so that its full collections during the run do
    not walk them again and again (about 8% of a cold ``build-shards``).

    Long work shows its progress on stderr meanwhile (:func:`prl.report.progress.for_console`): a bar on a terminal,
    a log line every ten seconds otherwise."""
    import rich.markup  # noqa: F401  (for _finish: loaded before the call, and frozen with the rest)

    from prl.report import console as report
    from prl.report.progress import for_console

    gc.freeze()
    SESSION.as_json = as_json
    result: CommandResult
    try:
        with progress.reporting(for_console(report.stderr)):
            result = call()
    except (PrlError, OSError) as exc:
        error = exc if isinstance(exc, PrlError) else RetryableIOError(f"{type(exc).__name__}: {exc}")
        result = ErrorResult(SESSION.command, redact(str(error)), int(error.exit_code))
    except KeyboardInterrupt:
        result = ErrorResult(SESSION.command, "interrupted", int(ExitCode.INTERRUPTED))
    raise typer.Exit(_finish(result, render))
