"""Write failures at every point of a writing command end it at once with exit 5 and one JSON object, the lock
released; a commit whose answer was lost is recognised in the Delta log; a rerun then completes exactly once.

Failures are injected into the real writers (the Parquet writer's every ``write_batch`` and ``close``, the Delta
commit call) on local and S3 stores; a real full disk (a small tmpfs, where this host lets the tests mount one)
is filled to many levels."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from typer.testing import CliRunner

from prl.cli import app
from prl.store import writer
from prl.store.locks import lock_for, step_name
from prl.store.tables import Store
from tests.pipeline_helpers import GrowingInput, read_table
from tests.s3_server import moto_endpoint, s3  # noqa: F401

pytestmark = pytest.mark.campaign  # long: `make test-all`

runner = CliRunner()
NO_SPACE = os.strerror(errno.ENOSPC)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3").url("store")


def invoke(args: list[str], within: float = 60.0) -> tuple[int, dict[str, Any]]:
    """Run a prl command in this process under ``--json``; it must end within ``within`` seconds and print
    exactly one JSON object whose ``exit_code`` is the command's."""
    done: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: done.update(res=runner.invoke(app, [*args, "--json"])), daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), f"prl {' '.join(args)} still running after {within:.0f} s"
    res = done["res"]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.output
    summary = json.loads(lines[0])
    assert summary["exit_code"] == res.exit_code
    return res.exit_code, summary


@dataclass
class Injected:
    """Counts calls per point (``write``, ``close``, ``commit``); raises ``error()`` at call ``at`` of ``point``."""

    point: str = ""
    at: int = 0
    error: Callable[[], BaseException] = lambda: OSError(errno.ENOSPC, NO_SPACE)
    calls: dict[str, int] = field(default_factory=dict)

    def tick(self, point: str) -> None:
        self.calls[point] = self.calls.get(point, 0) + 1
        if point == self.point and self.calls[point] == self.at:
            raise self.error()


@pytest.fixture
def injected(monkeypatch: pytest.MonkeyPatch) -> Iterator[Injected]:
    """Failures at the n-th Parquet ``write_batch`` / ``close`` of a store's data files, or at the n-th Delta
    commit call (before it reaches the log)."""
    faults = Injected()

    class FailingWriter(pq.ParquetWriter):
        def write_batch(self, *args: Any, **kwargs: Any) -> None:
            faults.tick("write")
            super().write_batch(*args, **kwargs)

        def close(self) -> None:
            faults.tick("close")
            super().close()

    real_commit = DeltaTable.create_write_transaction

    def commit(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        faults.tick("commit")
        real_commit(self, *args, **kwargs)

    monkeypatch.setattr(writer.pq, "ParquetWriter", FailingWriter)
    monkeypatch.setattr(DeltaTable, "create_write_transaction", commit)
    yield faults


def fresh_input(tmp_path: Path, records: int = 30) -> GrowingInput:
    data = GrowingInput(tmp_path / "in", files=2, seed=9, bad_every=10)
    data.grow(records)
    return data


COMMANDS = {
    "ingest": lambda data, store: ["ingest", str(data.root / "traces"), "--store", store, "--max-quarantine-rate", "1"],
    "ingest-rewards": lambda data, store: ["ingest", str(data.rewards_path), "--store", store, "--kind", "rewards"],
}


def assert_unlocked(store: str, step: str) -> None:
    lock = lock_for(store, step)
    lock.acquire()
    lock.release()


def assert_exactly_once(store: Store, data: GrowingInput) -> None:
    ids = read_table(store, "traces", ["sample_id"])["sample_id"].to_list()
    assert sorted(ids) == sorted(data.good)
    quarantine = read_table(store, "quarantine", ["source_uri", "source_line"])
    assert sorted(zip(quarantine["source_uri"], quarantine["source_line"])) == sorted(data.bad)
    rewards = read_table(store, "rewards", ["sample_id"])["sample_id"].to_list()
    assert sorted(rewards) == sorted(data.good)


def test_a_failure_at_every_write_close_and_commit_is_exit_5_and_a_rerun_completes(store_uri, tmp_path, injected):
    data = fresh_input(tmp_path)
    for command in COMMANDS.values():  # how many writes, closes and commits a clean run makes
        assert invoke(command(data, str(tmp_path / "counting")))[0] == 0
    points = dict(injected.calls)
    assert points["write"] >= 3 and points["close"] >= 3 and points["commit"] >= 3, points
    for point, count in points.items():
        for at in range(1, count + 1):
            store = f"{store_uri}/{point}-{at}"
            injected.point, injected.at, injected.calls = point, at, {}
            outcomes = []
            for step, command in COMMANDS.items():
                started = time.monotonic()
                code, summary = invoke(command(data, store))
                outcomes.append(code)
                if code != 0:
                    assert code == 5 and NO_SPACE in summary["error"], (point, at, summary)
                    assert time.monotonic() - started < 30
                assert_unlocked(store, step)
            assert sorted(outcomes) == [0, 5], (point, at, outcomes)  # met once, nothing else failed
            injected.point = ""
            for command in COMMANDS.values():
                assert invoke(command(data, store))[0] == 0
            assert_exactly_once(Store(store), data)


def test_a_commit_whose_answer_is_lost_is_found_in_the_log(store_uri, tmp_path, monkeypatch):
    real_commit = DeltaTable.create_write_transaction

    def applied_then_lost(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        real_commit(self, *args, **kwargs)
        raise OSError(errno.ECONNRESET, "Connection reset by peer")  # the answer never came

    monkeypatch.setattr(DeltaTable, "create_write_transaction", applied_then_lost)
    data = fresh_input(tmp_path)
    for command in COMMANDS.values():
        code, summary = invoke(command(data, store_uri))
        assert code == 0, summary
    monkeypatch.setattr(DeltaTable, "create_write_transaction", real_commit)
    assert_exactly_once(Store(store_uri), data)
    for command in COMMANDS.values():  # a rerun finds everything already there
        code, summary = invoke(command(data, store_uri))
        assert code == 0 and summary["samples" if "samples" in summary else "rows"] == 0, summary
    assert_exactly_once(Store(store_uri), data)


def test_a_real_conflict_is_exit_5_with_one_json_object(tmp_path, monkeypatch):
    def conflict(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        raise CommitFailedError("Transaction failed: a concurrent transaction conflicts")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", conflict)
    data = fresh_input(tmp_path)
    store = str(tmp_path / "store")
    code, summary = invoke(COMMANDS["ingest"](data, store))
    assert code == 5 and "concurrent transaction conflicts" in summary["error"]
    assert Store(store).read("traces").num_rows == 0
    assert_unlocked(store, "ingest")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (skipped where this host does not let the tests mount one)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """A ballast file that leaves about ``leave`` bytes free on ``disk``."""
    ballast = disk / f"ballast-{uuid.uuid4().hex}"
    free = shutil.disk_usage(disk).free
    with open(ballast, "wb") as fh:
        try:
            fh.write(b"\0" * max(0, free - leave))
        except OSError:
            pass
    return ballast


@pytest.mark.slow
def test_a_full_disk_at_many_levels_is_exit_5_never_a_hang(small_disk, tmp_path):
    data = fresh_input(tmp_path, records=200)
    met = set()
    for leave in range(0, 180_000, 12_000):  # from no room for the lock to room for everything
        store = str(small_disk / "store")
        ballast = fill(small_disk, leave)
        for command in COMMANDS.values():
            code, summary = invoke(command(data, store))
            assert code in (0, 5), summary
            if code == 5:
                assert NO_SPACE in summary["error"] or "space" in summary["error"].lower(), summary
                met.add(summary["error"].split(" in ")[0].split(" at ")[0])
        os.unlink(ballast)  # room again: the locks are free and a rerun completes
        for step, command in COMMANDS.items():
            assert_unlocked(store, step)
            assert invoke(command(data, store))[0] == 0
        assert_exactly_once(Store(store), data)
        shutil.rmtree(store)
    assert {"writing traces", "cannot take the ingest lock"} <= met, met


@pytest.mark.slow
def test_build_shards_on_a_full_disk_is_exit_5_never_a_hang(small_disk, tmp_path):
    data = fresh_input(tmp_path, records=300)
    store = str(tmp_path / "store")
    for command in COMMANDS.values():
        assert invoke(command(data, store))[0] == 0
    out = str(small_disk / "out")
    build = ["build-shards", "--store", store, "--out", out, "--set", "require_checks=false"]
    codes = []
    for leave in range(0, 280_000, 40_000):  # spill, shard files, manifest: each meets the full disk somewhere
        ballast = fill(small_disk, leave)
        code, summary = invoke(build)
        codes.append(code)
        assert code in (0, 5), summary
        if code == 5:
            assert NO_SPACE in summary["error"], summary
        os.unlink(ballast)
        assert_unlocked(store, step_name("build-shards", out))
        if code == 0:
            assert invoke(["verify", out])[0] == 0
        shutil.rmtree(out, ignore_errors=True)
    assert 5 in codes, codes
    code, summary = invoke(build)  # room again: the build completes and its set verifies
    assert code == 0, summary
    assert invoke(["verify", out])[0] == 0
