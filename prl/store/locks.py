"""One writer per store step: a lock file that names its holder and goes stale when the holder is dead.

The lock is ``STORE/_locks/<step>.lock``, created exclusively with its content (a fully written private file
hard-linked to the lock path, so a lock file is never seen empty; a conditional put on S3), holding JSON
``{holder, host, pid, run_id, started_at}``. The holder refreshes its mtime every ``HEARTBEAT_SECONDS``; a lock
is stale when its holder's process is gone (same host) or its heartbeat is older than ``stale_after`` seconds
(any host). A stale lock is judged and removed while holding a short ``flock`` on ``<step>.lock.guard`` (released
by the kernel if the process dies), and release happens under it too, so two runs breaking the same stale lock
cannot both win. An acquire interrupted half-way (Ctrl-C, SIGTERM) removes what it created. On S3
(:mod:`prl.store.s3lock`) conditional puts on the ETag do the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prl.errors import LockedError, RetryableIOError

STALE_ENV = "PRL_LOCK_STALE_AFTER"


def _stale_after_from_env(default: float = 300.0) -> float:
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


STALE_AFTER_SECONDS = _stale_after_from_env()
"""A lock whose holder cannot be checked (another host; any S3 lock) is stale after this long without a
heartbeat. Default 300 s; ``PRL_LOCK_STALE_AFTER`` sets it (e.g. lower it where killed runs on S3 must not block
the next cron run for five minutes)."""
HEARTBEAT_SECONDS = min(15.0, STALE_AFTER_SECONDS / 4)
"""Holders refresh their lock this often: well inside ``STALE_AFTER_SECONDS``."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class LocalLock:
    """An exclusive lock on a local store step. Use as a context manager."""

    path: str
    step: str
    stale_after: float = STALE_AFTER_SECONDS
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def holder_info(self) -> dict[str, Any]:
        return {
            "holder": f"{socket.gethostname()}:{os.getpid()}",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_id": self.run_id,
            "step": self.step,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def _read(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                return json.load(fh)
        except FileNotFoundError:
            return None
        except ValueError:
            return {}  # being written right now, or damaged: judged by its age alone

    def _is_stale(self, info: dict[str, Any]) -> bool:
        try:
            age = time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return True
        if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
            return not pid_alive(info["pid"]) or age > self.stale_after
        return age > self.stale_after

    def acquire(self) -> None:
        """Take the lock or raise :class:`LockedError` naming its live holder; a lock folder that cannot be
        created or written (the store path is a file, permission denied) raises :class:`RetryableIOError`."""
        try:
            self._acquire()
        except OSError as exc:
            raise RetryableIOError(f"cannot take the {self.step} lock at {self.path}: {exc}") from exc

    def _acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(5):
            try:
                if self._create():
                    self._thread = threading.Thread(target=self._heartbeat, name=f"prl-lock-{self.step}", daemon=True)
                    self._thread.start()
                    return
            except BaseException:  # interrupted half-way: never leave a lock that names this process
                self.release()
                raise
            with self._guard():  # judge and remove under the guard: the lock removed is the one judged stale
                info = self._read()
                if info is None:
                    continue
                if not self._is_stale(info):
                    raise LockedError(
                        f"another run holds the {self.step} lock: {info.get('holder', 'unknown holder')} "
                        f"(run {info.get('run_id', '?')}, since {info.get('started_at', '?')}); "
                        f"lock file {self.path}"
                    )
                os.unlink(self.path)
        raise LockedError(f"could not take the {self.step} lock at {self.path} (contended)")

    def _create(self) -> bool:
        """Create the lock file with its content in one step: written to a private file, then hard-linked to
        the lock path (which fails if it exists). True when the lock is ours."""
        tmp = f"{self.path}.{self.run_id}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.holder_info(), fh)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            return True
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Hold an exclusive ``flock`` on ``<lock>.guard`` (a few file operations long)."""
        fd = os.open(f"{self.path}.guard", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor drops the flock

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path)
            except FileNotFoundError:
                return

    def release(self) -> None:
        """Remove the lock if this run holds it (safe to call after a failed acquire)."""
        self._stop.set()
        with self._guard():
            info = self._read()
            if info and info.get("run_id") == self.run_id:
                os.unlink(self.path)

    def __enter__(self) -> LocalLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def step_name(*parts: str) -> str:
    """A lock step name safe as a file name: ``step_name("build-shards", "/data/out")`` →
    ``build-shards-<12 hex digits of the parts>`` (the parts themselves may hold slashes or ``s3://``)."""
    head, *rest = parts
    if not rest:
        return head
    return f"{head}-{hashlib.sha256(chr(0).join(rest).encode()).hexdigest()[:12]}"


@contextlib.contextmanager
def holding(store_uri: str, step: str, enabled: bool = True) -> Iterator[Any]:
    """Hold the ``step`` lock of the store for the ``with`` block (nothing when not ``enabled``, e.g. in a
    dry run, which writes nothing)."""
    if not enabled:
        yield None
        return
    lock = lock_for(store_uri, step)
    try:
        lock.acquire()
        yield lock
    finally:
        lock.release()  # only removes the lock if it is ours


def lock_for(store_uri: str, step: str, stale_after: float | None = None) -> Any:
    """The lock for ``step`` of the store at ``store_uri`` (local folders; ``s3://`` stores use conditional
    puts, see :mod:`prl.store.s3lock`). ``stale_after`` defaults to ``PRL_LOCK_STALE_AFTER`` as set now, else 300 s."""
    if stale_after is None:
        stale_after = _stale_after_from_env()
    if store_uri.startswith("s3://"):
        from prl.store.s3lock import S3Lock

        return S3Lock(store_uri, step, stale_after=stale_after)
    return LocalLock(os.path.join(store_uri, "_locks", f"{step}.lock"), step, stale_after=stale_after)
