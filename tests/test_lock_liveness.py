"""A lock whose holder ran on this host and is provably gone may be taken over at once (pid reuse does not fool
it); any other lock keeps the stale-time rule. :mod:`prl.store.liveness` on real processes, then the S3 lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from prl.errors import LockedError
from prl.store import liveness
from prl.store.s3lock import S3Lock
from tests.pipeline_helpers import prl_env
from tests.s3_server import environ_for, moto_endpoint, s3  # noqa: F401

pytestmark = pytest.mark.skipif(liveness.host_id() is None, reason="needs a Linux /proc of this pid namespace")

IDENTITY = "import json; from prl.store import liveness; print(json.dumps(liveness.identity()), flush=True)"


def child_identity(*then: str) -> tuple[subprocess.Popen[str], dict]:
    """A child process that prints its identity and then runs ``then`` (statements); it and that identity."""
    code = "; ".join([IDENTITY, *then])
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=prl_env(dict(os.environ)), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return fh.read().rpartition(")")[2].split()


def test_this_process_is_alive_and_named_exactly():
    me = liveness.identity()
    assert me["pid"] == os.getpid() and me["host_id"] == liveness.host_id()
    assert me["pid_start"] == int(stat_fields(os.getpid())[19])
    with open(liveness.BOOT_ID, encoding="ascii") as fh:
        assert liveness.host_id().startswith(fh.read().strip() + "/pid:[")
    assert liveness.holder_gone(me) is False


def test_a_reaped_process_is_gone_and_a_live_one_is_not():
    proc, ident = child_identity("import time; time.sleep(60)")
    try:
        assert ident["host_id"] == liveness.host_id() and ident["pid"] == proc.pid
        assert liveness.holder_gone(ident) is False
    finally:
        proc.kill()
        proc.wait()
    assert liveness.holder_gone(ident) is True


def test_a_zombie_is_gone_before_it_is_reaped():
    proc, ident = child_identity()
    deadline = time.monotonic() + 30
    while stat_fields(proc.pid)[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert liveness.holder_gone(ident) is True  # exited, not yet reaped: it runs no code again
    proc.wait()


def test_pid_reuse_other_hosts_and_partial_records_are_not_fooled():
    me = liveness.identity()
    assert liveness.holder_gone({**me, "pid_start": me["pid_start"] - 1}) is True  # same pid, a later process
    proc, dead = child_identity()
    proc.wait()
    assert liveness.holder_gone(dead) is True
    assert liveness.holder_gone({**dead, "host_id": "another-boot/pid:[1]"}) is False  # another host: no proof
    assert liveness.holder_gone({**dead, "host_id": None}) is False
    for missing in ("host_id", "pid", "pid_start"):
        assert liveness.holder_gone({k: v for k, v in dead.items() if k != missing}) is False
    assert liveness.holder_gone({**dead, "pid": True}) is False
    assert liveness.holder_gone({**dead, "pid_start": str(dead["pid_start"])}) is False
    assert liveness.holder_gone({}) is False


HOLD = (
    "import os, sys, time; from prl.store.s3lock import S3Lock; lock = S3Lock(sys.argv[1], 'ingest'); "
    "lock.acquire(); print(lock.run_id, flush=True); time.sleep(600)"
)


def killed_holder(store_uri: str, endpoint: str) -> str:
    """A process that takes the ingest lock, SIGKILLed and reaped; its run id."""
    env = prl_env({**environ_for(endpoint), "PRL_LOCK_STALE_AFTER": "300"})
    proc = subprocess.Popen([sys.executable, "-c", HOLD, store_uri], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return run_id


def lock_body(s3, key: str = "store/_locks/ingest.lock") -> dict:  # noqa: F811
    return json.loads(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())


@pytest.mark.s3
def test_an_s3_lock_of_a_killed_process_on_this_host_is_taken_over_at_once(s3, caplog):  # noqa: F811
    store_uri = s3.url("store")
    dead_run = killed_holder(store_uri, s3.endpoint)
    left = lock_body(s3)
    assert (left["run_id"], left["host_id"]) == (dead_run, liveness.host_id())
    started = time.monotonic()
    with S3Lock(store_uri, "ingest", stale_after=300.0) as lock:  # nowhere near stale
        assert time.monotonic() - started < 10
        assert lock_body(s3)["run_id"] == lock.run_id
        assert lock_body(s3)["pid_start"] == liveness.identity()["pid_start"]
    assert "its process on this host is gone" in caplog.text
    assert s3.keys("store/_locks/") == []


@pytest.mark.s3
def test_an_s3_lock_of_another_host_waits_for_the_stale_time(s3):  # noqa: F811
    store_uri = s3.url("store")
    killed_holder(store_uri, s3.endpoint)
    body = {**lock_body(s3), "host_id": "another-boot/pid:[4026531836]"}  # the same pid, on another machine
    s3.client.put_object(Bucket=s3.bucket, Key="store/_locks/ingest.lock", Body=json.dumps(body).encode())
    with pytest.raises(LockedError, match=body["run_id"]):
        S3Lock(store_uri, "ingest", stale_after=300.0).acquire()
    time.sleep(2.2)
    with S3Lock(store_uri, "ingest", stale_after=1.0) as lock:  # stale: taken over as before
        assert lock_body(s3)["run_id"] == lock.run_id


@pytest.mark.s3
def test_an_s3_lock_of_a_live_process_on_this_host_is_not_taken(s3):  # noqa: F811
    store_uri = s3.url("store")
    with S3Lock(store_uri, "ingest", stale_after=300.0) as live:
        assert live._heartbeat is not None
        live._heartbeat.stop()  # a hung holder: alive, no heartbeat, not yet stale
        with pytest.raises(LockedError, match=live.run_id):
            S3Lock(store_uri, "ingest", stale_after=300.0).acquire()
