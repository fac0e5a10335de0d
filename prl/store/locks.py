"""One writer per store step: a lock that names its holder and ends with its holder's process.

A local store's lock is an exclusive ``flock`` on ``STORE/_locks/<step>.lock`` (the store's real path), which
holds the holder record (:mod:`prl.store.holder`) while the lock is held. The kernel drops the ``flock`` when
its process dies, however it dies, so a dead holder never blocks the next run and there is no staleness to
judge. Release removes the file under the ``flock``; a run that opened the removed file sees it unlinked and
tries again, so two runs never hold one step. A lock file that is removed or replaced behind a holder's back
(someone cleaning ``_locks/``) counts as lost: that run commits nothing more. ``s3://`` stores use conditional
puts (:mod:`prl.store.s3lock`).

Locks are keyed by the resolved location (:func:`prl.io.locations.resolved_location`): two spellings of one
store or output folder (a symlink, ``a//b``, a trailing slash) take the same lock. While held, a lock is
registered with :func:`prl.store.holder.register`, and every commit checks it first
(:func:`prl.store.holder.ensure_held`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prl.errors import LockedError, RetryableIOError
from prl.io.locations import resolved_location
from prl.store import holder
from prl.store.holder import STALE_ENV, stale_after_from_env
from prl.store.s3lock import S3Lock

if TYPE_CHECKING:
    from prl.store.tables import Store

__all__ = ["STALE_ENV", "LocalLock", "S3Lock", "holding", "lock_for", "running", "step_name"]


@dataclass(eq=False)
class LocalLock:
    """An exclusive lock on a step of a local store; ``path`` is its lock file. Use as a context manager."""

    path: str
    step: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _fd: int | None = field(default=None, repr=False)
    _inode: tuple[int, int] | None = field(default=None, repr=False)

    def acquire(self) -> None:
        """Take the lock or raise :class:`LockedError` naming its live holder; a lock folder that cannot be
        created or written (the store path is a file, a read-only filesystem) raises :class:`RetryableIOError`."""
        try:
            self._acquire()
        except OSError as exc:
            self.release()
            raise RetryableIOError(f"cannot take the {self.step} lock at {self.path}: {exc}") from exc
        except BaseException:  # interrupted half-way: never leave a lock that names this process
            self.release()
            raise

    def _acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise LockedError(holder.held_message(self.step, self._read(), self.path)) from None
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            if self._same_file():  # not a file its last holder removed between our open and our flock
                self._write_record()
                return
            self._close()
        raise LockedError(f"could not take the {self.step} lock at {self.path} (contended)")

    def _same_file(self) -> bool:
        """Whether our descriptor is still the file at :attr:`path` (recording its identity when first asked)."""
        if self._fd is None:
            return False
        mine = os.fstat(self._fd)
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            return False
        ident = (mine.st_dev, mine.st_ino)
        if self._inode is None:
            self._inode = ident
        return mine.st_nlink > 0 and (there.st_dev, there.st_ino) == ident == self._inode

    def _write_record(self) -> None:
        assert self._fd is not None
        data = json.dumps(holder.holder_record(self.run_id, self.step, holder.utc_now())).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        os.fsync(self._fd)

    def _read(self) -> dict[str, Any]:
        """The holder record in the lock file ({} while it is being written, or when unreadable)."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                info = json.load(fh)
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def still_held(self) -> bool:
        """Whether this run still holds the lock: its file is still the one it locked."""
        try:
            return self._same_file()
        except OSError:
            return False

    def _close(self) -> None:
        fd, self._fd, self._inode = self._fd, None, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    def release(self) -> None:
        """Remove the lock file and drop the lock if this run holds it (safe to call after a failed acquire)."""
        if self._fd is None:
            return
        try:
            if self._same_file():
                os.unlink(self.path)
        except OSError:
            pass  # a lock file left behind blocks nobody: the flock ends with the descriptor
        finally:
            self._close()

    def __enter__(self) -> LocalLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def step_name(step: str, *locations: str) -> str:
    """A lock step name safe as a file name for a step that also writes to ``locations`` (folders or ``s3://``
    URIs, resolved first, so two spellings of one place give one name): ``step_name("build-shards",
    "/data/out")`` → ``build-shards-<12 hex digits>``; with no locations, ``step`` itself."""
    if not locations:
        return step
    key = chr(0).join(resolved_location(location) for location in locations)
    return f"{step}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _uri(store: Store | str) -> str:
    return store if isinstance(store, str) else store.uri


@contextlib.contextmanager
def holding(store: Store | str, step: str, enabled: bool = True) -> Iterator[LocalLock | S3Lock | None]:
    """Hold the ``step`` lock of the store for the ``with`` block, registered so that every commit to the
    store checks it first (nothing when not ``enabled``, e.g. in a dry run, which writes nothing)."""
    if not enabled:
        yield None
        return
    location = resolved_location(_uri(store))
    lock = lock_for(_uri(store), step)
    try:
        lock.acquire()
        holder.register(location, lock)
        yield lock
    finally:
        holder.unregister(location, lock)
        lock.release()  # only removes the lock if it is ours


@contextlib.contextmanager
def running(store: Store, step: str, *, enabled: bool = True) -> Iterator[LocalLock | S3Lock | None]:
    """One step's run on ``store``, as every writing step makes it: the ``step`` lock held for the block
    (:func:`holding`: none when not ``enabled``, as in a dry run, which writes nothing) and the tables the run
    opens kept until it ends (:meth:`~prl.store.tables.Store.one_run`: each table's log replayed once)."""
    with holding(store.uri, step, enabled=enabled) as lock, store.one_run():
        yield lock


def lock_for(store_uri: str, step: str, stale_after: float | None = None) -> LocalLock | S3Lock:
    """The lock for ``step`` of the store at ``store_uri``, at its resolved location (local folders: a
    ``flock``; ``s3://`` stores: conditional puts, see :mod:`prl.store.s3lock`). ``stale_after`` (S3 only)
    defaults to ``PRL_LOCK_STALE_AFTER`` as set now, else 300 s."""
    location = resolved_location(store_uri)
    if location.startswith("s3://"):
        return S3Lock(location, step, stale_after=stale_after_from_env() if stale_after is None else stale_after)
    return LocalLock(os.path.join(location, "_locks", f"{step}.lock"), step)
