"""kill -9 of the driver of a Ray step, on the session's real two-node cluster (:mod:`tests.conftest`): the run
killed while its parts are being written on the cluster publishes nothing, and the next run publishes exactly
the set a local build gives, once."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prl.shards.build import build_shards
from prl.shards.layout import meta_root
from prl.shards.options import ShardOptions
from tests.shards_fixtures import varied_store
from tests.test_engines_ray import SHARD_OPTIONS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.campaign,  # a Ray cluster: `make test-all`
    pytest.mark.xdist_group("ray"),  # one cluster per session: every Ray test in one xdist worker
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the prl[ray] extra"),
]

DRIVER = """
import sys
sys.path.insert(0, {root!r})
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
build_shards({store!r}, {out!r}, options=ShardOptions.from_mapping({options!r}), engine="ray")
"""


def _published(out: Path) -> list[str]:
    """The set folders of ``out`` (OUT holds nothing else)."""
    return sorted(p.name for p in out.iterdir() if p.name != ".prl") if out.exists() else []


def _staged_parts(out: Path) -> bool:
    """Whether a part of the build is being written in its staging folder (the driver has handed the parts to the
    cluster)."""
    staging = Path(meta_root(out)) / "staging"
    return staging.exists() and any(p.suffix in (".tmp", ".parquet") for p in staging.rglob("part-*"))


def test_a_driver_killed_while_the_cluster_writes_parts_publishes_nothing_and_the_rerun_equals_local(
    tmp_path, ray_cluster
):
    store = varied_store(str(tmp_path / "store"))
    local = build_shards(store, str(tmp_path / "local"), options=ShardOptions.from_mapping(SHARD_OPTIONS))
    out = tmp_path / "ray"
    root = str(Path(__file__).resolve().parents[1])
    code = DRIVER.format(root=root, store=store.uri, out=str(out), options=SHARD_OPTIONS)
    driver = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    deadline = time.monotonic() + 120
    while not _staged_parts(out) and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    driver.send_signal(signal.SIGKILL)
    assert driver.wait(30) == -signal.SIGKILL  # killed mid-run, not after it ended
    assert _published(out) == []  # nothing is visible before the driver's rename

    rerun = build_shards(store, str(out), options=ShardOptions.from_mapping(SHARD_OPTIONS), engine="ray")
    assert (rerun.status, rerun.set_id, rerun.shards) == ("built", local.set_id, local.shards)
    for part in local.shards:
        assert (Path(rerun.set_dir) / part["file"]).read_bytes() == (Path(local.set_dir) / part["file"]).read_bytes()
    assert _published(out) == [Path(rerun.set_dir).name]  # one set: nothing shipped twice
    again = build_shards(store, str(out), options=ShardOptions.from_mapping(SHARD_OPTIONS), engine="ray")
    assert again.status == "nothing_new"
