"""What the local and the S3 store lock share: the holder record a lock carries, the heartbeat thread that
keeps a lock fresh, the message that names a live holder, and the register of the locks this process holds,
which every commit consults (:func:`ensure_held`) so that a run whose lock was taken over commits nothing.

A holder record is JSON ``{holder, host, host_id, pid, pid_start, run_id, step, started_at, heartbeat_at}``:
``holder`` is ``host:pid``, ``host_id`` and ``pid_start`` name the process beyond pid reuse
(:mod:`prl.store.liveness`; null where ``/proc`` cannot tell), ``started_at`` an ISO-8601 UTC second,
``heartbeat_at`` Unix seconds with three decimals.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from prl.errors import LockLostError
from prl.store import liveness

STALE_ENV = "PRL_LOCK_STALE_AFTER"


def stale_after_from_env(default: float = 300.0) -> float:
    """``PRL_LOCK_STALE_AFTER`` (seconds > 0) when set and valid, else ``default`` (a bad value is logged)."""
    raw = os.environ.get(STALE_ENV)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        logging.getLogger(__name__).warning("ignoring %s=%r: expected seconds > 0", STALE_ENV, raw)
        return default
    return value


STALE_AFTER_SECONDS = stale_after_from_env()
"""An S3 lock is stale after this long without a heartbeat, unless its holder ran on this host and is provably
gone, when it may be taken over at once (a local lock needs no such judgement: the kernel drops it with its
process). Default 300 s; ``PRL_LOCK_STALE_AFTER`` sets it (e.g. lower it where killed runs on
S3 must not block the next cron run for five minutes)."""
HEARTBEAT_SECONDS = min(15.0, STALE_AFTER_SECONDS / 4)
"""Holders refresh their lock this often: well inside ``STALE_AFTER_SECONDS``."""


def utc_now() -> str:
    """The current UTC time to the second, ISO 8601 (``2026-01-31T12:00:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def holder_record(run_id: str, step: str, started_at: str) -> dict[str, Any]:
    """The holder record of this process's run ``run_id`` for ``step``, its heartbeat now."""
    host = socket.gethostname()
    return {
        "holder": f"{host}:{os.getpid()}",
        "host": host,
        **liveness.identity(),
        "run_id": run_id,
        "step": step,
        "started_at": started_at,
        "heartbeat_at": f"{time.time():.3f}",
    }


def held_message(step: str, info: dict[str, Any], where: str) -> str:
    """The :class:`~prl.errors.LockedError` message naming the live holder of ``step``'s lock at ``where``; a
    holder that took the lock a moment ago may not have written its record yet, which the message then says."""
    if not info.get("holder"):
        return (
            f"another run holds the {step} lock and has just taken it (it has not written who it is yet); "
            f"lock at {where}; retry in a moment"
        )
    return (
        f"another run holds the {step} lock: {info['holder']} "
        f"(run {info.get('run_id', 'not recorded')}, since {info.get('started_at', 'not recorded')}); lock at {where}"
    )


def lost_message(step: str, where: str) -> str:
    """The :class:`~prl.errors.LockLostError` message of a lock taken over from this run."""
    return (
        f"the {step} lock at {where} was taken over by another run while this one held it; "
        "nothing more is committed (the other run carries on, a rerun resumes)"
    )


class Heartbeat:
    """A daemon thread calling ``beat()`` every ``HEARTBEAT_SECONDS`` (read at each wait) until
    :meth:`stop` or until ``beat()`` returns False."""

    def __init__(self, name: str, beat: Callable[[], bool]) -> None:
        self._beat = beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if not self._beat():
                return

    def stop(self) -> None:
        """Stop beating and wait for a beat in flight (not when called from the heartbeat thread itself)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


class HeldLock(Protocol):
    """What :func:`ensure_held` needs of a lock: its step, where it lives, and whether it is still ours."""

    step: str

    @property
    def path(self) -> str: ...

    def still_held(self) -> bool: ...


_held: dict[str, list[HeldLock]] = {}
_held_mutex = threading.Lock()


def register(location: str, lock: HeldLock) -> None:
    """Record that this process holds ``lock`` on the store at ``location`` (a resolved location)."""
    with _held_mutex:
        _held.setdefault(location, []).append(lock)


def unregister(location: str, lock: HeldLock) -> None:
    """Forget ``lock`` (a no-op when it was never registered)."""
    with _held_mutex:
        held = [other for other in _held.get(location, []) if other is not lock]
        if held:
            _held[location] = held
        else:
            _held.pop(location, None)


def ensure_held(location: str) -> None:
    """Raise :class:`~prl.errors.LockLostError` (exit 3) when a lock this process holds on the store at
    ``location`` is no longer its own; called right before every commit to that store. Each check asks the
    lock's backing store (a conditional heartbeat on S3), so a takeover is seen even between heartbeats."""
    with _held_mutex:
        held = list(_held.get(location, []))
    for lock in held:
        if not lock.still_held():
            raise LockLostError(lost_message(lock.step, lock.path))
