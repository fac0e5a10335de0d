"""The lock contract, the same for local folders (``O_EXCL`` files) and ``s3://`` stores (conditional puts):
one holder per step, a LockedError that names the holder, heartbeats, stale takeover with exactly one winner."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from prl.errors import LockedError
from prl.store import locks
from prl.store.locks import LocalLock, lock_for
from prl.store.s3lock import S3Lock
from prl.store.tables import filesystem_for
from tests.s3_server import moto_endpoint, s3  # noqa: F401


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store_uri(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3").url("store")


def lock_info(lock) -> dict | None:
    """The holder info JSON stored in a lock, read through the store's filesystem (None when absent)."""
    fs, path = filesystem_for(lock.path)
    try:
        with fs.open_input_stream(path) as stream:
            return json.loads(stream.read())
    except FileNotFoundError:
        return None


def test_lock_for_picks_the_store_kind(store_uri):
    lock = lock_for(store_uri, "ingest")
    if store_uri.startswith("s3://"):
        assert isinstance(lock, S3Lock)
        assert lock.path == f"{store_uri}/_locks/ingest.lock"
    else:
        assert isinstance(lock, LocalLock)
        assert lock.path == os.path.join(store_uri, "_locks", "ingest.lock")


def test_one_holder_per_step_and_error_names_it(store_uri):
    first = lock_for(store_uri, "ingest")
    first.acquire()
    try:
        info = lock_info(first)
        assert info is not None
        assert info["holder"] == f"{socket.gethostname()}:{os.getpid()}"
        assert (info["host"], info["pid"], info["run_id"], info["step"]) == (
            socket.gethostname(),
            os.getpid(),
            first.run_id,
            "ingest",
        )
        assert time.strptime(info["started_at"], "%Y-%m-%dT%H:%M:%SZ")
        second = lock_for(store_uri, "ingest")
        with pytest.raises(LockedError) as caught:
            second.acquire()
        message = str(caught.value)
        assert f"{socket.gethostname()}:{os.getpid()}" in message
        assert first.run_id in message
        assert "ingest" in message and first.path in message
        assert caught.value.exit_code == 3
        with lock_for(store_uri, "checks"):  # another step is another lock
            pass
    finally:
        first.release()
    assert lock_info(first) is None
    with lock_for(store_uri, "ingest") as again:  # released: free to take
        assert lock_info(again)["run_id"] == again.run_id
    assert lock_info(again) is None


def test_context_manager_releases_on_error(store_uri):
    lock = lock_for(store_uri, "ingest")
    with pytest.raises(RuntimeError, match="boom"), lock:
        assert lock_info(lock)["run_id"] == lock.run_id
        raise RuntimeError("boom")
    assert lock_info(lock) is None


def test_heartbeat_keeps_a_live_lock_fresh(store_uri, monkeypatch):
    monkeypatch.setattr(locks, "HEARTBEAT_SECONDS", 0.2)
    with lock_for(store_uri, "ingest", stale_after=1.0) as holder:
        time.sleep(2.5)  # well past stale_after: only the heartbeat keeps it alive
        with pytest.raises(LockedError, match=holder.run_id):
            lock_for(store_uri, "ingest", stale_after=1.0).acquire()
        assert lock_info(holder)["run_id"] == holder.run_id


def test_stale_lock_is_taken_over_and_old_holder_cannot_delete_it(store_uri):
    dead = lock_for(store_uri, "ingest")
    dead.acquire()
    dead._stop.set()  # the holder hangs: no more heartbeats, no release
    time.sleep(2.2)
    breaker = lock_for(store_uri, "ingest", stale_after=1.0)
    breaker.acquire()
    try:
        assert lock_info(breaker)["run_id"] == breaker.run_id
        dead.release()  # the old holder wakes up: it must not delete the new holder's lock
        assert lock_info(breaker)["run_id"] == breaker.run_id
        with pytest.raises(LockedError, match=breaker.run_id):
            lock_for(store_uri, "ingest").acquire()
    finally:
        breaker.release()
    assert lock_info(breaker) is None


def test_two_breakers_cannot_both_win(store_uri):
    dead = lock_for(store_uri, "ingest")
    dead.acquire()
    dead._stop.set()
    time.sleep(2.2)
    breakers = [lock_for(store_uri, "ingest", stale_after=1.0) for _ in range(4)]
    outcomes: dict[int, str] = {}
    start = threading.Barrier(len(breakers))

    def attempt(i: int) -> None:
        start.wait()
        try:
            breakers[i].acquire()
            outcomes[i] = "won"
        except LockedError:
            outcomes[i] = "locked"

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(len(breakers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, outcome in outcomes.items() if outcome == "won"]
    assert len(winners) == 1, outcomes
    assert lock_info(breakers[winners[0]])["run_id"] == breakers[winners[0]].run_id
    breakers[winners[0]].release()


@pytest.mark.s3
def test_s3_holder_learns_it_lost_the_lock(s3):  # noqa: F811
    store_uri = s3.url("store")
    dead = S3Lock(store_uri, "ingest")
    dead.acquire()
    dead._stop.set()
    time.sleep(2.2)
    with S3Lock(store_uri, "ingest", stale_after=1.0) as breaker:
        assert dead.heartbeat() is False
        assert dead.lost
        assert breaker.heartbeat() is True and not breaker.lost
        info = lock_info(breaker)
        assert info["run_id"] == breaker.run_id
        assert float(info["heartbeat_at"]) == pytest.approx(time.time(), abs=5)
    assert s3.keys("store/") == []


@pytest.mark.s3
def test_s3_lock_key_layout(s3):  # noqa: F811
    with S3Lock(s3.url("a/b/store/"), "build-shards") as lock:
        assert s3.keys() == ["a/b/store/_locks/build-shards.lock"]
        assert lock.path == s3.url("a/b/store/_locks/build-shards.lock")
    with S3Lock(s3.url(""), "ingest"):
        assert s3.keys() == ["_locks/ingest.lock"]


@pytest.mark.s3
def test_s3_release_when_unreachable_logs_and_does_not_raise(s3, monkeypatch, caplog):  # noqa: F811
    lock = S3Lock(s3.url("store"), "ingest", stale_after=60)
    lock.acquire()
    lock._client = None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{sock.getsockname()[1]}")
    lock.release()
    assert "releasing the ingest lock" in caplog.text and "goes stale after 60 s" in caplog.text
    assert "testing" not in caplog.text
    assert s3.keys("store/_locks/") == ["store/_locks/ingest.lock"]
