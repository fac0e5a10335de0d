"""The Ray engine against the local engine on a real two-node Ray cluster on 127.0.0.1 (the session's
``ray_cluster``, :mod:`tests.conftest`): check-tokens and build-shards."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow as pa
import pytest

from prl.checks import check_tokens
from prl.errors import LockedError
from prl.pipeline import runner
from prl.pipeline.recipe import from_mapping
from prl.shards.build import build_shards
from prl.shards.layout import meta_root
from prl.shards.options import ShardOptions
from prl.store.locks import holding
from tests.checks_helpers import EOS, chat_prompt, enc, make_store, row, tokenizer_dir
from tests.engine_cases import SHARD_OPTIONS
from tests.shards_fixtures import varied_store
from tests.test_shards_merged_build import store_with as merged_store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.campaign,  # a Ray cluster: `make test-all`
    pytest.mark.xdist_group("ray"),  # one cluster per session: every Ray test in one xdist worker
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the prl[ray] extra"),
]


def _manifest(result) -> dict:
    return json.loads(Path(result.manifest_path).read_text())


def test_build_shards_recipe_on_ray_is_byte_identical_to_local(tmp_path, ray_cluster):
    store = varied_store(str(tmp_path / "store"))
    local = build_shards(store, str(tmp_path / "local"), options=ShardOptions.from_mapping(SHARD_OPTIONS))
    assert (local.status, local.rows, len(local.shards)) == ("built", 56, 16)
    recipe = from_mapping(
        {"store": {"uri": store.uri, "out": str(tmp_path / "ray"), "engine": "ray"}, "shards": SHARD_OPTIONS}
    )
    assert recipe.store.engine == "ray"
    run = runner.run(recipe)
    assert run.exit_code == 0, run.to_json()
    summary = run.step("shards").summary
    assert summary is not None and summary["status"] == "built"
    assert summary["set_id"] == local.set_id
    assert [s["sha256"] for s in summary["shards"]] == [s["sha256"] for s in local.shards]
    assert json.loads(Path(summary["manifest_path"]).read_text()) == _manifest(local)  # statistics, KL sums too
    ray_set = Path(summary["set_dir"])
    for part in local.shards:
        assert (ray_set / part["file"]).read_bytes() == (Path(local.set_dir) / part["file"]).read_bytes()
    assert not (Path(meta_root(tmp_path / "ray")) / "staging").exists()  # spills and staging gone
    again = build_shards(store, str(tmp_path / "ray"), options=ShardOptions.from_mapping(SHARD_OPTIONS), engine="ray")
    assert again.status == "nothing_new"  # already shipped, as on the local engine


def test_merged_rows_on_ray_are_the_bytes_of_a_local_build(tmp_path, ray_cluster):
    store = merged_store(tmp_path)
    options = ShardOptions(merge_turns=True, singleton_baseline="batch", target_tokens=8)
    local = build_shards(store, str(tmp_path / "local"), options=options)
    remote = build_shards(store, str(tmp_path / "ray"), options=options, engine="ray")
    assert (local.status, local.rows, len(local.shards)) == ("built", 3, 2)  # a0+a1+a2 | b0+b1, solo
    assert remote.set_id == local.set_id and remote.shards == local.shards
    assert _manifest(remote) == _manifest(local)  # merged_turns statistics (the parts' unmerged tokens) too
    for part in local.shards:
        assert (Path(remote.set_dir) / part["file"]).read_bytes() == (Path(local.set_dir) / part["file"]).read_bytes()


PROMPT = chat_prompt("Greet")
GOOD = [*enc("Hello world."), EOS]
SPLIT = enc("Hel") + enc("lo world.") + [EOS]


def _check_rows() -> list[dict]:
    """Good samples and sampled splits (notes), a bad logprob, and two sessions: one clean second turn, one
    forked."""
    out = [row(f"g{i}", PROMPT, GOOD) for i in range(5)]
    out += [row(f"s{i}", PROMPT, SPLIT, [-0.25] * len(SPLIT)) for i in range(3)]
    out.append(row("lp", PROMPT, GOOD, [0.5] * len(GOOD)))
    reply = chat_prompt("Again")
    for sid, prompt in (("a", PROMPT), ("b", chat_prompt("Other"))):
        out.append(row(f"{sid}-t0", PROMPT, GOOD, session_id=sid, turn=0))
        out.append(row(f"{sid}-t1", [*prompt, *GOOD, *reply], GOOD, session_id=sid, turn=1))
    return out


def _verdicts(store) -> list[dict]:
    table = store.read("checks").drop_columns(["checked_at"])
    return sorted(table.to_pylist(), key=lambda r: r["sample_id"])


def _summary(result) -> dict:
    out = result.to_json()
    for key in ("elapsed_s", "store", "checks_version", "samples_per_s", "tokens_per_s"):
        out.pop(key, None)
    return out


@pytest.mark.parametrize("sample_rate", [1.0, 0.5])
def test_check_tokens_on_ray_commits_the_rows_local_does(tmp_path, ray_cluster, sample_rate):
    rows = _check_rows()
    local_store = make_store(tmp_path / "local", rows)
    ray_store = make_store(tmp_path / "ray", rows)
    local = check_tokens(local_store, tokenizer_dir(), sample_rate=sample_rate, batch_size=4)
    on_ray = check_tokens(ray_store, tokenizer_dir(), sample_rate=sample_rate, batch_size=4, engine="ray")
    expected = {1.0: (13, 0, 8, 4, 1, 1), 0.5: (8, 5, 6, 1, 1, 0)}[sample_rate]
    v, p = local.verdicts, local.prefix
    assert (local.checked, local.sampled_out, v["ok"], v["note"], v["invalid"], p["CLEAN"]) == expected
    assert p["FORK"] == 1
    assert _verdicts(ray_store) == _verdicts(local_store)
    assert _summary(on_ray) == _summary(local)
    from tests.delta_log import commit_infos

    local_info, ray_info = commit_infos(local_store, "checks", 1)[0], commit_infos(ray_store, "checks", 1)[0]
    keys = sorted(k for k in local_info if k.startswith("prl.") and k != "prl.commit_id")
    assert [ray_info[k] for k in keys] == [local_info[k] for k in keys]
    again = check_tokens(ray_store, tokenizer_dir(), sample_rate=sample_rate, engine="ray")
    assert (again.checked, again.skipped_existing, again.checks_version) == (0, expected[0], None)


def test_a_second_run_on_ray_still_exits_3(tmp_path, ray_cluster):
    from typer.testing import CliRunner

    from prl.cli import app

    store = make_store(tmp_path / "store", _check_rows())
    with holding(store.uri, "check-tokens"):
        with pytest.raises(LockedError) as caught:
            check_tokens(store, tokenizer_dir(), engine="ray")
        assert caught.value.exit_code == 3
        cli = CliRunner().invoke(
            app, ["check-tokens", "--store", store.uri, "--tokenizer", tokenizer_dir(), "--engine", "ray", "--json"]
        )
        assert cli.exit_code == 3
    assert store.version("checks") is None
    assert pa.__version__  # the store was left as it was: no verdicts committed under someone else's lock


def _twice_or_refuse(task: int) -> list[int]:
    if task < 0:
        raise LockedError(f"task {task} refused")
    return [task, task * 10]


def test_ray_map_runs_each_task_on_the_cluster_and_raises_a_prl_error_as_itself(ray_cluster):
    from prl.engines.ray import RayEngine

    engine = RayEngine()  # RAY_ADDRESS: the cluster
    assert sorted(engine.map(_twice_or_refuse, [1, 2, 3])) == [1, 2, 3, 10, 20, 30]
    assert list(engine.map(_twice_or_refuse, [])) == []
    with pytest.raises(LockedError, match="task -1 refused"):
        list(engine.map(_twice_or_refuse, [4, -1]))
