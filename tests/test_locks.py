"""The lock contract, the same for local folders (a kernel ``flock``) and ``s3://`` stores (conditional puts):
one holder per step, a LockedError that names the holder, one lock per resolved location, and a run whose lock
was lost commits nothing more. S3 only: heartbeats, stale takeover with exactly one winner."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from prl.errors import LockedError, LockLostError
from prl.schema import REWARDS
from prl.store import holder, locks
from prl.store.locks import LocalLock, lock_for
from prl.store.s3lock import S3Lock, shared_s3_client
from prl.store.tables import Store, filesystem_for
from tests.s3_server import moto_endpoint, s3  # noqa: F401
from tests.shards_fixtures import reward, table


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
        assert lock.path == os.path.join(os.path.realpath(store_uri), "_locks", "ingest.lock")


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


def hang(lock: S3Lock) -> None:
    """The holder hangs: no more heartbeats, no release."""
    assert lock._heartbeat is not None
    lock._heartbeat.stop()


@pytest.mark.s3
def test_heartbeat_keeps_a_live_lock_fresh(s3, monkeypatch):  # noqa: F811
    store_uri = s3.url("store")
    monkeypatch.setattr(holder, "HEARTBEAT_SECONDS", 0.2)
    with lock_for(store_uri, "ingest", stale_after=2.0) as live:  # ages are whole seconds: 10 beats per stale time
        time.sleep(4.5)  # well past stale_after: only the heartbeat keeps it alive
        with pytest.raises(LockedError, match=live.run_id):
            lock_for(store_uri, "ingest", stale_after=2.0).acquire()
        assert lock_info(live)["run_id"] == live.run_id


@pytest.mark.s3
def test_stale_lock_is_taken_over_and_old_holder_cannot_delete_it(s3):  # noqa: F811
    store_uri = s3.url("store")
    dead = S3Lock(store_uri, "ingest")
    dead.acquire()
    hang(dead)
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


@pytest.mark.s3
def test_two_breakers_cannot_both_win(s3, monkeypatch):  # noqa: F811
    store_uri = s3.url("store")
    dead = S3Lock(store_uri, "ingest")
    dead.acquire()
    hang(dead)
    # the winner beats often, so that a loser slowed past the stale time never finds the new lock stale too
    monkeypatch.setattr(holder, "HEARTBEAT_SECONDS", 0.2)
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
    hang(dead)
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


def other_spellings(store_uri: str, tmp_path) -> list[str]:
    """Other names of the same store: a trailing slash, doubled slashes and (local) a symlink to the folder."""
    if store_uri.startswith("s3://"):
        bucket, _, key = store_uri[len("s3://") :].partition("/")
        return [f"{store_uri}/", f"s3://{bucket}//{key}//"]
    os.makedirs(store_uri, exist_ok=True)
    os.symlink(store_uri, tmp_path / "alias")
    head, tail = os.path.split(store_uri)
    return [f"{store_uri}/", f"{head}//{tail}", str(tmp_path / "alias"), f"file://{tmp_path / 'alias'}"]


def test_two_spellings_of_one_store_take_one_lock(store_uri, tmp_path):
    with lock_for(store_uri, "ingest") as first:
        for spelling in other_spellings(store_uri, tmp_path):
            other = lock_for(spelling, "ingest")
            assert other.path == first.path
            with pytest.raises(LockedError, match=first.run_id):
                other.acquire()


def test_step_names_follow_the_resolved_location(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(out, tmp_path / "link")
    name = locks.step_name("build-shards", str(out))
    assert locks.step_name("build-shards", str(tmp_path / "link")) == name
    assert locks.step_name("build-shards", f"{out}/") == name
    assert locks.step_name("build-shards", f"{tmp_path}//out") == name
    assert locks.step_name("build-shards", str(tmp_path / "elsewhere")) != name
    s3_name = locks.step_name("build-shards", "s3://b/runs/out")
    assert locks.step_name("build-shards", "s3://b//runs/out/") == s3_name != name


def reward_batch(sample_id: str):
    return table(REWARDS, [reward(sample_id, 1.0)]).to_batches()


def take_over(lock) -> LocalLock | S3Lock:
    """Another run takes the lock from its holder: on S3 after the holder stalled past the stale time; locally
    after someone removed the lock file (the only way a kernel lock changes hands while its holder lives)."""
    if isinstance(lock, S3Lock):
        hang(lock)
        time.sleep(2.2)
        thief = S3Lock(lock.store_uri, lock.step, stale_after=1.0)
    else:
        os.unlink(lock.path)
        thief = LocalLock(lock.path, lock.step)
    thief.acquire()
    return thief


def test_a_run_whose_lock_was_taken_over_commits_nothing_more(store_uri):
    store = Store(store_uri)
    with locks.holding(store, "ingest-rewards") as lock:
        assert store.commit("rewards", reward_batch("a:0")).version == 1
        thief = take_over(lock)
        with pytest.raises(LockLostError, match="taken over by another run") as caught:
            store.commit("rewards", reward_batch("b:0"))
        assert caught.value.exit_code == 3
        with pytest.raises(LockLostError):  # every commit path: the pending files of write_files too
            store.write_files("rewards", reward_batch("c:0")).commit()
    assert store.version("rewards") == 1
    assert store.read("rewards").column("sample_id").to_pylist() == ["a:0"]
    assert lock_info(thief)["run_id"] == thief.run_id  # the loser's release left the new holder's lock alone
    thief.release()


def test_a_commit_through_another_spelling_is_checked_too(store_uri, tmp_path):
    store = Store(store_uri)
    with locks.holding(store_uri, "ingest-rewards") as lock:
        alias = Store(other_spellings(store_uri, tmp_path)[1])
        take_over(lock).release()
        with pytest.raises(LockLostError):
            alias.commit("rewards", reward_batch("a:0"))
    assert store.version("rewards") is None


@pytest.mark.s3
def test_one_s3_client_serves_a_process_per_environment_and_a_forked_child_makes_its_own(s3, monkeypatch):  # noqa: F811
    client = shared_s3_client()
    locks_client = [S3Lock(s3.url("store"), step).client for step in ("ingest", "build-shards")]
    assert locks_client == [client, client] and shared_s3_client() is client
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a client of its own, never the parent's connections
        try:
            os.write(write, b"own" if shared_s3_client() is not client else b"parent's")
        finally:
            os._exit(0)  # never back into the test runner, however the child fares
    os.close(write)  # a child that dies before writing ends the read with nothing
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"own"
    os.close(read)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{sock.getsockname()[1]}")
    other = shared_s3_client()
    assert other is not client and other.meta.endpoint_url == os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_SESSION_TOKEN", "rotated")  # new credentials under the same key id: a new client
    assert shared_s3_client() is not other
    assert other.meta.config.retries["total_max_attempts"] == 4  # AWS_MAX_ATTEMPTS unset: the default
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    once = shared_s3_client()
    assert once.meta.config.retries["total_max_attempts"] == 1
