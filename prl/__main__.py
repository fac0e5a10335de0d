"""The ``prl`` console script and ``python -m prl``.

This module is what the process runs first, so it stays tiny: it makes SIGINT and SIGTERM interrupt
(``KeyboardInterrupt``) before the command line's libraries load (typer, rich: a tenth of a second or more), and
answers an interrupt that lands while they load as every other exit does: code 130 and, under ``--json``, one
JSON object on stdout. From the moment :mod:`prl.cli` runs the command line, it answers interrupts itself.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _interrupted_early() -> NoReturn:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    argv = sys.argv[1:]
    head = argv[: argv.index("--")] if "--" in argv else argv
    if "--json" in head:
        import json

        command = next((a for a in head if not a.startswith("-")), "prl")
        payload = {"command": command, "error": "interrupted", "exit_code": 130}
        sys.stdout.write(json.dumps(payload, sort_keys=True) + "\n")
        sys.stdout.flush()
    sys.stderr.write("interrupted\n")
    sys.exit(130)


def main() -> None:
    """Run the ``prl`` command line (see :func:`prl.cli.main`). A signal the parent told this process to ignore
    (``SIG_IGN``, as shells do for background jobs) stays ignored."""
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, _interrupt)
        from prl.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:  # only an interrupt before prl.cli took over reaches this
        _interrupted_early()


if __name__ == "__main__":
    main()
