"""Choosing an engine: names, recipe key, CLI option, and ``local`` needing no Ray."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from prl.engines import LOCAL, get_engine, split
from prl.errors import UsageError
from prl.pipeline.recipe import from_mapping


def test_engine_names():
    assert get_engine() is LOCAL and get_engine("local") is LOCAL and LOCAL.name == "local"
    ray_engine = get_engine("ray")
    assert (ray_engine.name, getattr(ray_engine, "address", "?")) == ("ray", None)  # RAY_ADDRESS, as ray.init
    assert get_engine(ray_engine) is ray_engine
    with pytest.raises(UsageError, match="unknown engine 'spark'; choose one of local, ray"):
        get_engine("spark")


def test_local_map_runs_the_tasks_in_order_in_this_process():
    seen: list[int] = []

    def task(n: int) -> list[int]:
        seen.append(n)
        return [n] * n

    assert list(LOCAL.map(task, [2, 0, 3])) == [2, 2, 3, 3, 3] and seen == [2, 0, 3]
    assert (LOCAL.width(5), LOCAL.width(0)) == (1, 0)


def test_local_map_on_threads_runs_one_task_per_item_side_by_side():
    started = threading.Barrier(3, timeout=10)  # passes only while three tasks run at once

    def task(n: int) -> list[tuple[int, str]]:
        if n < 3:
            started.wait()
        return [(n, threading.current_thread().name)] * 2

    assert (LOCAL.width(5, threads=3), LOCAL.width(0, threads=3), LOCAL.width(5, threads=1)) == (5, 0, 1)
    out = list(LOCAL.map(task, [0, 1, 2, 3, 4], threads=3))
    assert sorted(n for n, _ in out) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert len({name for _, name in out}) == 3 and threading.current_thread().name not in {name for _, name in out}
    for n in range(5):  # a task's results come back together
        at = [i for i, (m, _) in enumerate(out) if m == n]
        assert at[1] == at[0] + 1


def test_local_map_on_threads_raises_a_tasks_error_as_itself():
    def task(n: int) -> list[int]:
        if n == 2:
            raise UsageError("task 2 met a bad option")
        return [n]

    with pytest.raises(UsageError, match="task 2 met a bad option"):
        list(LOCAL.map(task, [0, 1, 2, 3], threads=2))


def test_split_cuts_consecutive_runs_as_equal_as_they_can_be():
    assert split([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split([1, 2, 3, 4, 5], 3) == [[1, 2], [3, 4], [5]]
    assert split([1, 2], 9) == [[1], [2]]
    assert split([1, 2, 3], 0) == [[1, 2, 3]]
    assert split([], 4) == []


def test_recipe_engine_key(tmp_path):
    recipe = from_mapping({"store": {"uri": str(tmp_path / "s"), "engine": "ray"}})
    assert recipe.store.engine == "ray" and recipe.to_json()["store"]["engine"] == "ray"
    assert from_mapping({"store": {"uri": str(tmp_path / "s")}}).store.engine == "local"
    with pytest.raises(UsageError, match=r"\[store\] engine: expected one of local, ray, got 'dask'"):
        from_mapping({"store": {"uri": str(tmp_path / "s"), "engine": "dask"}})


def test_local_engine_imports_no_ray(tmp_path):
    code = (
        "import sys, prl, prl.cli, prl.engines, prl.shards.build, prl.checks.run, prl.ingestion.traces, prl.score.run\n"
        "from prl.engines import get_engine; get_engine('ray')\n"  # naming the engine does not import Ray either
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_rejects_an_unknown_engine(tmp_path):
    from typer.testing import CliRunner

    from prl.cli import app

    result = CliRunner().invoke(
        app, ["build-shards", "--store", str(tmp_path), "--out", str(tmp_path / "o"), "--engine", "x"]
    )
    assert result.exit_code == 2 and "Invalid value for '--engine'" in result.output
