"""The one protocol every command's result keeps, so the CLI (and any caller) treats them alike.

A result (``IngestResult``, ``SideIngestResult``, ``CheckResult``, ``ShardResult``, ``ExportResult``,
``RunResult``, ``StoreInspection`` / ``ShardsInspection``, ``VerifyResult``, and :class:`ErrorResult` for a
command that failed) has

- ``exit_code``: the process exit code it stands for (docs/design.md, :class:`prl.errors.ExitCode`);
- ``to_json()``: the one machine-readable summary ``--json`` prints, a dict of JSON values that holds
  ``"command"`` and ``"exit_code"`` (equal to ``exit_code``);
- ``headline()``: one line of plain text (no markup, no newline) saying what happened, for logs and for the
  step table of ``prl run``.

Rendering for people (rich tables, histograms) lives in :mod:`prl.report`; results stay plain data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class CommandResult(Protocol):
    """What every command's result provides (see the module docstring)."""

    @property
    def exit_code(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...

    def headline(self) -> str: ...


@dataclass(frozen=True)
class ErrorResult:
    """A command that stopped with an error: what ``--json`` prints for it. ``command`` is the command's name
    (``ingest``, ``check-tokens``, …, or ``prl`` when the command line did not name one)."""

    command: str
    error: str
    exit_code: int

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "error": self.error, "exit_code": self.exit_code}

    def headline(self) -> str:
        return one_line(f"{self.command}: error: {self.error}")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) folded to one space."""
    return " ".join(text.split())
