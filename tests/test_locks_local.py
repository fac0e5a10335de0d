"""Local step locks beyond the shared contract (tests/test_locks.py): the kernel drops a lock with its process
(killed, never hung), racing processes, interrupted acquires, unusable lock folders, ``holding`` and
``step_name``."""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prl.errors import LockedError, RetryableIOError
from prl.shards.target import LocalOut
from prl.store.locks import LocalLock, holding, lock_for, step_name


def lock_path(store: str, step: str = "ingest") -> str:
    return os.path.join(store, "_locks", f"{step}.lock")


def write_lock(path: str, **info) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"holder": f"{info.get('host')}:{info.get('pid')}", "run_id": "old", **info}, fh)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def locks_left(folder) -> list[str]:
    """Lock files in a ``_locks`` folder."""
    return sorted(os.listdir(folder))


def test_holding_releases_only_its_own_lock(tmp_path):
    store = str(tmp_path)
    first = lock_for(store, "ingest")
    first.acquire()
    info = json.loads(Path(lock_path(store)).read_text())
    assert (info["pid"], info["host"], info["run_id"], info["step"]) == (
        os.getpid(),
        socket.gethostname(),
        first.run_id,
        "ingest",
    )
    second = lock_for(store, "ingest")
    with pytest.raises(LockedError, match=rf"holds the ingest lock: {socket.gethostname()}:{os.getpid()} "):
        second.acquire()
    second.release()  # not its lock: nothing happens
    assert os.path.exists(lock_path(store))
    with pytest.raises(LockedError), holding(store, "ingest"):
        pass  # a failed acquire inside holding() does not release the holder's lock either
    assert os.path.exists(lock_path(store))
    first.release()
    assert locks_left(os.path.join(store, "_locks")) == []


def test_a_dead_holder_on_this_host_is_taken_over(tmp_path):
    write_lock(lock_path(str(tmp_path)), host=socket.gethostname(), pid=dead_pid())
    with holding(str(tmp_path), "ingest") as lock:
        assert json.loads(Path(lock_path(str(tmp_path))).read_text())["run_id"] == lock.run_id
    assert locks_left(tmp_path / "_locks") == []


def test_an_interrupted_acquire_leaves_no_lock(tmp_path, monkeypatch):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalLock, "_write_record", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lock_for(str(tmp_path), "ingest").acquire()
    assert locks_left(tmp_path / "_locks") == []
    monkeypatch.undo()
    with holding(str(tmp_path), "ingest"):  # and nothing of it blocks the next run
        pass


HOLD = "import sys, time; from prl.store.locks import lock_for; lock_for(sys.argv[1], 'ingest').acquire(); "
HOLD += "print('held', flush=True); time.sleep(600)"


def test_a_hung_holder_keeps_its_lock_and_a_killed_one_loses_it_at_once(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        proc.send_signal(signal.SIGSTOP)  # hung, however long: still its lock
        time.sleep(0.5)
        with pytest.raises(LockedError, match=rf"{socket.gethostname()}:{proc.pid} "):
            lock_for(str(tmp_path), "ingest").acquire()
    finally:
        proc.kill()
        proc.wait()
    with holding(str(tmp_path), "ingest") as lock:  # killed: the kernel dropped its flock, no waiting
        assert json.loads(Path(lock_path(str(tmp_path))).read_text())["run_id"] == lock.run_id


def test_an_unusable_lock_folder_is_retryable_io(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(RetryableIOError, match="Not a directory"):
        lock_for(str(tmp_path / "file"), "ingest").acquire()


def test_step_names_are_file_names():
    assert step_name("ingest") == "ingest"
    name = step_name("build-shards", "/data/out")
    assert name.startswith("build-shards-") and len(name) == len("build-shards-") + 12 and "/" not in name
    assert step_name("build-shards", "/data/out") == name != step_name("build-shards", "/data/out2")


def _race(path: str, barrier, results, done) -> None:
    lock = LocalLock(path, "ingest")
    barrier.wait()
    try:
        lock.acquire()
    except LockedError:
        results.put("locked")
        return
    results.put("won")
    done.wait(60)  # hold until every other process has tried (however slowly it was scheduled)
    lock.release()


@pytest.mark.slow
def test_many_processes_breaking_one_stale_lock_only_one_wins(tmp_path):
    path = lock_path(str(tmp_path))
    ctx = mp.get_context("fork")
    for _round in range(3):
        write_lock(path, host=socket.gethostname(), pid=dead_pid())
        barrier, results, done = ctx.Barrier(6), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_race, args=(path, barrier, results, done)) for _ in range(6)]
        for p in procs:
            p.start()
        outcomes = sorted(results.get(timeout=60) for _ in procs)
        done.set()
        for p in procs:
            p.join(30)
        assert outcomes == ["locked"] * 5 + ["won"]
        assert locks_left(os.path.dirname(path)) == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, 300.0),
        ("2", 2.0),
        ("0.5", 0.5),
        ("x", 300.0),
        ("-1", 300.0),
        ("0", 300.0),
        ("inf", 300.0),
        ("nan", 300.0),
    ],
)
def test_stale_after_from_the_environment(monkeypatch, raw, expected):
    from prl.store.holder import STALE_ENV, stale_after_from_env

    if raw is None:
        monkeypatch.delenv(STALE_ENV, raising=False)
    else:
        monkeypatch.setenv(STALE_ENV, raw)
    assert stale_after_from_env() == expected


def test_two_builds_into_one_out_spelled_two_ways_never_run_at_once(tmp_path):
    from prl.shards.build import build_shards
    from prl.store.tables import Store

    out = tmp_path / "out"
    out.mkdir()
    os.symlink(out, tmp_path / "out-link")
    store = str(tmp_path / "store")
    with holding(store, LocalOut(str(out)).lock_step()) as held:
        for spelling in (tmp_path / "out-link", f"{out}/", f"{tmp_path}//out"):
            with pytest.raises(LockedError, match=held.run_id):
                build_shards(Store(store), str(spelling))


def test_a_read_only_store_names_the_read_only_filesystem(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(RetryableIOError, match=r"cannot take the ingest lock at .*Read-only file system"):
            lock_for(str(mount), "ingest").acquire()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_holder_that_has_not_written_its_record_yet_is_named_plainly(tmp_path):
    """Between its ``flock`` and its record, a holder's lock file is empty: the message says just that, not
    "unknown holder (run ?, since ?)"."""
    path = lock_path(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken, nothing written yet
    try:
        with pytest.raises(LockedError) as caught:
            lock_for(str(tmp_path), "ingest").acquire()
    finally:
        os.close(fd)
    assert str(caught.value) == (
        f"another run holds the ingest lock and has just taken it (it has not written who it is yet); "
        f"lock at {os.path.realpath(path)}; retry in a moment"
    )
