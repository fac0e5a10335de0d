"""Exceptions and the exit codes they map to (docs/design.md). Every exit code means one thing.

Messages never carry credentials: an error's text goes through :func:`prl.redact.redact` (the userinfo of every
URL, credential header values, the environment's secrets), whatever library wrote the text — an endpoint such as
``AWS_ENDPOINT_URL=http://user:pass@minio:9000`` shows up in delta-rs and pyarrow errors.
"""

from __future__ import annotations

from enum import IntEnum

from prl.redact import redact


class ExitCode(IntEnum):
    OK = 0
    """Done, also when there was nothing new."""
    DATA_PROBLEMS = 1
    """Done, but quarantine or drift rates passed their threshold."""
    USAGE = 2
    """Usage or configuration error: nothing was written."""
    LOCKED = 3
    """Another run holds the lock for this step."""
    RETRYABLE_IO = 5
    """A storage or network error that a later run may not meet."""
    INTERRUPTED = 130
    """Stopped by a signal (Ctrl-C, SIGTERM); committed work stays, uncommitted work is invisible."""


class PrlError(Exception):
    """Base class; ``exit_code`` says what the CLI returns."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class UsageError(PrlError):
    """Bad options, recipe or input selection (exit 2)."""

    exit_code = ExitCode.USAGE


class FormatDetectionError(UsageError):
    """No known wire format matches a source file."""


class LockedError(PrlError):
    """Another run holds the lock (exit 3)."""

    exit_code = ExitCode.LOCKED


class RetryableIOError(PrlError):
    """Storage or network trouble (exit 5); a rerun resumes safely."""

    exit_code = ExitCode.RETRYABLE_IO


class LockLostError(LockedError):
    """The run's lock was taken over by another run (after a stall past its stale time): the run stops before
    its next commit (exit 3, as for any lock another run holds)."""
