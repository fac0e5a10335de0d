"""Every numeric option outside its range (:mod:`prl.bounds`) is a usage error: exit 2, one JSON object naming the
option, nothing run and nothing written, on the command line, in a recipe and in the library call; never a panic
from delta-rs or an ``OverflowError`` from a conversion underneath."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prl import bounds
from prl.errors import UsageError
from prl.maintain import maintain
from prl.pipeline.recipe import load
from prl.score.run import score_ref
from tests.pipeline_helpers import GrowingInput, invoke_json, tree, write_recipe

HUGE = ("9223372036854775807", "99999999999999999999", "-9223372036854775809")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bounds")
    data = GrowingInput(root / "in", files=1, seed=5)
    data.grow(3)
    code, _ = invoke_json(
        ["ingest", str(root / "in" / "traces"), "--store", str(root / "store"), "--max-quarantine-rate", "1"]
    )
    assert code == 0
    return root / "store"


def test_out_of_range_numbers_are_usage_errors_before_anything_runs(store):
    before = tree(store)
    score = ["score-ref", "--store", str(store), "--ref-model", "ref", "--endpoint", "http://127.0.0.1:9/v1"]
    cases = {
        "--retention-hours": (["maintain", "--store", str(store)], [*HUGE, "0", "876001"]),
        "--target-mb": (["maintain", "--store", str(store)], [*HUGE, "0", "-1", "1048577"]),
        "--batch-tokens": (score, [*HUGE, "0", str(bounds.MAX_BATCH_TOKENS + 1)]),
        "--concurrency": (score, [*HUGE, "0", "4097"]),
        "--retries": (score, [*HUGE, "-1", "101"]),
        "--timeout": (score, ["nan", "inf", "-inf", "1e400", "0", "-1", "86400.5"]),
    }
    for option, (command, values) in cases.items():
        for value in values:
            code, summary = invoke_json([*command, option, value])
            assert (code, summary["command"]) == (2, command[0]), (option, value, summary)
            assert f"Invalid value for '{option}'" in summary["error"], (option, value, summary)
    assert tree(store) == before  # no lock, no commit, no vacuum
    code, summary = invoke_json(["maintain", "--store", str(store), "--retention-hours", "876000", "--target-mb", "1"])
    assert (code, summary["retention_hours"]) == (0, 876000)


@given(st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none()))
def test_the_library_calls_take_exactly_the_range(value):
    def refused(check) -> bool:
        try:
            check()
        except UsageError:
            return True
        return False

    in_range = isinstance(value, int) and not isinstance(value, bool)
    assert refused(lambda: bounds.check_int("--x", value, 1, 876000)) == (not (in_range and 1 <= value <= 876000))
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    ok_seconds = finite and 0 < value <= bounds.MAX_TIMEOUT_S
    assert refused(lambda: bounds.check_seconds("--timeout", value)) == (not ok_seconds)


def test_library_calls_refuse_out_of_range_values_and_missing_stores(store, tmp_path):
    for kwargs in ({"retention_hours": 2**63 - 1}, {"retention_hours": 10**20}, {"target_mb": 2**63}):
        with pytest.raises(UsageError, match="must be an integer in"):
            maintain(str(store), **kwargs)
    for kwargs in ({"retries": 10**20}, {"concurrency": 2**64}, {"timeout": float("nan")}, {"batch_tokens": 2**62}):
        with pytest.raises(UsageError, match="must be"):
            score_ref(str(store), "ref", endpoint="http://127.0.0.1:9/v1", **kwargs)
    for call in (
        lambda: maintain(str(tmp_path / "TYPO")),
        lambda: score_ref(str(tmp_path / "TYPO"), "ref", endpoint="http://127.0.0.1:9/v1"),
    ):
        with pytest.raises(UsageError, match="is not a prl store: no such folder"):
            call()
    assert tree(tmp_path) == []


def test_recipes_take_the_same_ranges(tmp_path, store):
    sections = [
        {"maintain": {"retention_hours": 2**63 - 1}},
        {"maintain": {"target_mb": 2**40}},
        {"score_ref": {"ref_model": "r", "endpoint": "http://127.0.0.1:9/v1", "retries": 1000}},
        {"score_ref": {"ref_model": "r", "endpoint": "http://127.0.0.1:9/v1", "timeout": 1e300}},
        {"score_ref": {"ref_model": "r", "endpoint": "http://127.0.0.1:9/v1", "concurrency": 2**31}},
    ]
    for number, extra in enumerate(sections):
        recipe = write_recipe(tmp_path / f"r{number}.toml", {"store": {"uri": str(store)}, **extra})
        with pytest.raises(UsageError, match=r"an integer in \[|a number in"):
            load(str(recipe))
