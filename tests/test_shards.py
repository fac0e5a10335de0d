"""build_shards end to end on small stores built from the real schemas."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.errors import UsageError
from prl.schema import CHECKS, REF_LOGPROBS, REWARDS, SHARD, TRACES
from prl.shards import build as shards
from prl.shards import gather, scan, scores
from prl.shards.build import build_shards
from prl.shards.layout import meta_root
from prl.shards.options import ShardOptions, parse_version
from prl.shards.scan import side_sums
from tests.shards_fixtures import make_store, random_store, ref, reward, table, trace, varied_store, verdict


def read_set(result) -> pa.Table:
    manifest = json.loads(Path(result.manifest_path).read_text())
    return pa.concat_tables(pq.read_table(os.path.join(result.set_dir, s["file"])) for s in manifest["shards"])


def by_id(table: pa.Table) -> dict[str, dict]:
    return {row["sample_id"]: row for row in table.to_pylist()}


def small_store(tmp_path, **kw):
    traces = [
        trace("a0:0", "ga", [1, 2], [10, 11, 12]),
        trace("a1:0", "ga", [1, 2], [13, 14], completion_mask=[True, False]),
        trace("b0:0", "gb", [3], [20]),
    ]
    rewards = [reward("a0:0", 1.0), reward("a1:0", 0.0), reward("b0:0", 0.5)]
    return make_store(str(tmp_path / "store"), traces, rewards, **kw)


def test_basic_columns_values_and_manifest(tmp_path):
    store = small_store(tmp_path)
    res = build_shards(store, str(tmp_path / "out"))
    assert res.status == "built" and res.exit_code == 0 and res.rows == 3
    table = read_set(res)
    assert table.schema.equals(SHARD)
    rows = by_id(table)
    a0, a1, b0 = rows["a0:0"], rows["a1:0"], rows["b0:0"]
    assert a0["input_ids"] == [1, 2, 10, 11, 12] and a0["prompt_len"] == 2
    assert a0["advantage"] == 0.5 and a1["advantage"] == -0.5 and a0["group_size"] == 2
    # b0 is a group of one: batch baseline = mean(1, 0, 0.5) = 0.5
    assert b0["advantage"] == 0.0 and b0["group_size"] == 1
    assert a1["loss_mask"] == [True, False]
    assert a1["token_advantages"] == [-0.5, 0.0]
    assert a0["token_advantages"] == [0.5, 0.5, 0.5]
    assert a0["behavior_logprobs"] == pytest.approx([-0.1, -0.2, -0.3], rel=1e-6)
    assert a0["kl"] is None and a0["ref_logprobs"] is None and a0["topk_ids"] is None
    assert a0["staleness"] == 0 and a0["policy_version"] == "step-10"
    manifest = json.loads(Path(res.manifest_path).read_text())
    assert manifest["schema_version"] == "1" and manifest["columns"] == SHARD.names
    assert manifest["source"]["versions"]["traces"] == store.version("traces")
    assert manifest["statistics"]["groups_of_one"] == 1
    assert manifest["statistics"]["groups_of_one_fell_back"] == 1
    meta = os.path.dirname(res.manifest_path)
    for folder, entry in [(res.set_dir, e) for e in manifest["shards"]] + [(meta, manifest["samples"])]:
        path = os.path.join(folder, entry["file"])
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == entry["sha256"]
        assert os.path.getsize(path) == entry["bytes"]
    assert sum(s["tokens"] for s in manifest["shards"]) == 5 + 4 + 2
    # the layout: the set folder holds only its parts; everything else is beside OUT, in .out.prl
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == [res.set_id]
    assert sorted(os.listdir(res.set_dir)) == [e["file"] for e in manifest["shards"]]
    assert res.manifest_path == str(Path(meta_root(out)) / "sets" / res.set_id / "manifest.json")
    assert sorted(os.listdir(meta)) == ["manifest.json", "sample_ids.arrow"]
    assert sorted(os.listdir(meta_root(out))) == ["frontier", "frontier.json", "index.json", "out.json", "sets"]
    index = json.loads(Path(Path(meta_root(out)) / "index.json").read_text())
    assert [s["set_id"] for s in index["sets"]] == [res.set_id]
    assert index["sets"][0]["files"] == [f"{res.set_id}/{e['file']}" for e in manifest["shards"]]


def test_polars_and_pyarrow_read_shards(tmp_path):
    res = build_shards(
        random_store(str(tmp_path / "s"), 10, 3, with_ref=True),
        str(tmp_path / "out"),
        options=ShardOptions(kl="column", target_tokens=60),
    )
    files = sorted(os.path.join(res.set_dir, s["file"]) for s in res.shards)
    assert len(files) > 1
    df = pl.read_parquet(files)
    assert df.height == 30 and df.columns == SHARD.names
    assert pq.ParquetDataset(files).read().num_rows == 30
    md = pq.ParquetFile(files[0]).metadata
    encodings = {
        md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i).encodings for i in range(md.num_columns)
    }
    assert "BYTE_STREAM_SPLIT" in encodings["behavior_logprobs.list.element"]
    assert md.row_group(0).column(0).compression == "ZSTD"


def test_rebuild_is_byte_identical(tmp_path):
    store = random_store(str(tmp_path / "s"), 12, 3, with_ref=True)
    opts = ShardOptions(kl="advantages", kl_coef=0.05, target_tokens=80, seed=7)
    first = build_shards(store, str(tmp_path / "out"), options=opts)
    again = build_shards(store, str(tmp_path / "out"), options=opts, rebuild=True)
    other = build_shards(store, str(tmp_path / "out2"), options=opts)
    assert first.set_id == again.set_id == other.set_id
    names = sorted(os.listdir(first.set_dir))
    assert names == sorted(os.listdir(other.set_dir))
    for name in names:
        assert (
            Path(os.path.join(first.set_dir, name)).read_bytes() == Path(os.path.join(other.set_dir, name)).read_bytes()
        )
    assert [s["sha256"] for s in first.shards] == [s["sha256"] for s in again.shards]


def test_incremental_ships_each_sample_once(tmp_path):
    store = small_store(tmp_path)
    out = str(tmp_path / "out")
    first = build_shards(store, out)
    second = build_shards(store, out)
    assert second.status == "nothing_new" and second.already_shipped == 3 and second.rows == 0
    store.commit("traces", table(TRACES, [trace("c0:0", "gc", [5], [6, 7])]).to_batches())
    store.commit("rewards", table(REWARDS, [reward("c0:0", 1.0)]).to_batches())
    store.commit("checks", table(CHECKS, [verdict("c0:0")]).to_batches())
    third = build_shards(store, out)
    assert third.status == "built" and third.rows == 1 and third.already_shipped == 3
    assert list(by_id(read_set(third))) == ["c0:0"]
    assert third.set_id != first.set_id
    index = json.loads(Path(os.path.join(meta_root(out), "index.json")).read_text())
    assert {s["set_id"] for s in index["sets"]} == {first.set_id, third.set_id}
    rebuilt = build_shards(store, out, rebuild=True)
    assert rebuilt.rows == 4
    # the rebuild replaced both earlier sets: OUT holds only the new one, rows and meta
    assert sorted(n for n in os.listdir(out) if not n.startswith(".")) == [rebuilt.set_id]
    assert os.listdir(os.path.join(meta_root(out), "sets")) == [rebuilt.set_id]
    assert not os.path.exists(os.path.join(meta_root(out), "retired"))
    index = json.loads(Path(os.path.join(meta_root(out), "index.json")).read_text())
    assert [s["set_id"] for s in index["sets"]] == [rebuilt.set_id]


def test_drops_counted_by_reason(tmp_path):
    traces = [
        trace("ok:0", "g1", [1], [2, 3]),
        trace("ok2:0", "g1", [1], [4]),
        trace("abort:0", "g2", [1], [2], finish_reason="abort"),
        trace("empty:0", "g3", [1], [], completion_logprobs=[]),
        trace("nan:0", "g4", [1], [2]),
        trace("inf:0", "g5", [1], [2]),
        trace("norew:0", "g6", [1], [2]),
        trace("drift:0", "g7", [1], [2]),
        trace("unchecked:0", "g8", [1], [2]),
        trace("warn:0", "g9", [1], [2]),
        trace("dup:0", "g10", [1], [2]),
        trace("dup:0", "g10", [1], [3], record_digest="other"),
        trace("badmask:0", "g11", [1], [2, 3], completion_mask=[True]),
    ]
    rewards = [reward(t["sample_id"], 1.0) for t in traces if t["sample_id"] not in ("nan:0", "inf:0", "norew:0")]
    rewards += [reward("nan:0", math.nan), reward("inf:0", math.inf), reward("ok2:0", 0.0, at=5)]
    checks = [verdict(t["sample_id"]) for t in traces if t["sample_id"] not in ("drift:0", "unchecked:0", "warn:0")]
    checks += [verdict("drift:0", "drift"), verdict("warn:0", "warn")]
    store = make_store(str(tmp_path / "s"), traces, rewards, checks)
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(max_drop_rate=0.5))
    assert res.drops == {
        "duplicate_sample_id": 2,
        "finish_reason": 1,
        "empty_completion": 1,
        "mask_length_mismatch": 1,
        "unchecked": 1,
        "verdict_warn": 1,
        "verdict_drift": 1,
        "missing_reward": 1,
        "nonfinite_reward": 2,
    }
    assert res.rows == 2 and res.considered == 13
    rows = by_id(read_set(res))
    # the later reward event (0.0 at t+5) superseded the earlier 1.0
    assert rows["ok2:0"]["reward"] == 0.0 and rows["ok:0"]["advantage"] == 0.5
    assert res.exit_code == 1  # 11 of 13 dropped > 0.5
    warn_ok = build_shards(store, str(tmp_path / "out2"), options=ShardOptions(allow_warn=True))
    assert "verdict_warn" not in warn_ok.drops and warn_ok.rows == 3
    lenient = build_shards(store, str(tmp_path / "out3"), options=ShardOptions(require_checks=False, allow_warn=True))
    assert "unchecked" not in lenient.drops and lenient.rows == 4


def test_staleness_lengths_and_versions(tmp_path):
    traces = [
        trace("new:0", "g1", [1], [2], policy_version="step-120"),
        trace("old:0", "g2", [1], [2], policy_version="100"),
        trace("mid:0", "g3", [1], [2], policy_version="global_step_115"),
        trace("nover:0", "g4", [1], [2], policy_version=None),
        trace("long:0", "g5", [1, 2, 3], [2], policy_version="step-120"),
    ]
    store = make_store(str(tmp_path / "s"), traces, [reward(t["sample_id"], 1.0) for t in traces])
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(max_staleness=10, max_prompt_tokens=2))
    assert res.drops == {"prompt_too_long": 1, "unknown_version": 1, "stale": 1}
    rows = by_id(read_set(res))
    assert rows["new:0"]["staleness"] == 0 and rows["mid:0"]["staleness"] == 5
    res2 = build_shards(store, str(tmp_path / "out2"), options=ShardOptions(current_version="step-130"))
    assert by_id(read_set(res2))["old:0"]["staleness"] == 30 and res2.drops == {}
    assert parse_version("step-120") == 120 and parse_version("v3-rc") == 3 and parse_version("x") is None


def test_constant_groups_dropped(tmp_path):
    traces = [trace(f"{g}{i}:0", g, [1], [2]) for g in ("c", "v") for i in range(3)]
    rewards = [reward(t["sample_id"], 1.0 if t["group_id"] == "c" else float(i)) for i, t in enumerate(traces)]
    store = make_store(str(tmp_path / "s"), traces, rewards)
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(drop_constant_groups=True))
    assert res.drops == {"constant_group": 3} and res.rows == 3
    assert res.statistics["constant_groups_dropped"] == 1
    assert sorted(r["advantage"] for r in read_set(res).to_pylist()) == [-1.0, 0.0, 1.0]


def test_weighted_reward_components(tmp_path):
    traces = [trace("x:0", "g", [1], [2]), trace("y:0", "g", [1], [3])]
    rewards = [
        reward("x:0", 1.0, "acc"),
        reward("x:0", 2.0, "fmt"),
        reward("y:0", 0.0, "acc"),
        reward("y:0", 1.0, "fmt"),
    ]
    store = make_store(str(tmp_path / "s"), traces, rewards)
    res = build_shards(
        store, str(tmp_path / "out"), options=ShardOptions.from_mapping({"rewards": {"acc": 1.0, "fmt": 0.5}})
    )
    rows = by_id(read_set(res))
    assert rows["x:0"]["reward"] == 2.0 and rows["y:0"]["reward"] == 0.5
    assert rows["x:0"]["advantage"] == 0.75


def test_kl_into_reward_matches_loop(tmp_path):
    lp = {"a:0": [-0.5, -1.0], "b:0": [-0.2]}
    rf = {"a:0": [-0.7, -0.4], "b:0": [-0.9]}
    traces = [trace(s, "g", [1], [5] * len(v), completion_logprobs=v) for s, v in lp.items()]
    refs = [ref(s, v) for s, v in rf.items()] + [ref("a:0", [0.0, 0.0], at=-5)]  # older row loses
    store = make_store(str(tmp_path / "s"), traces, [reward("a:0", 1.0), reward("b:0", 0.0)], refs=refs)
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="reward", kl_coef=0.1, kl_estimator="k3"))
    rows = by_id(read_set(res))

    def k3(d):
        x = min(max(-d, -20), 20)
        return min(math.exp(x) - x - 1, 10)

    f32 = lambda v: float(np.float32(v))  # noqa: E731
    expected = {
        s: (1.0 if s == "a:0" else 0.0) - 0.1 * sum(k3(f32(a) - f32(b)) for a, b in zip(lp[s], rf[s])) for s in lp
    }
    for s in lp:
        assert rows[s]["reward"] == pytest.approx(expected[s], rel=1e-12)
        assert rows[s]["kl"] == pytest.approx([k3(f32(a) - f32(b)) for a, b in zip(lp[s], rf[s])], rel=1e-6)
        assert rows[s]["ref_logprobs"] == pytest.approx(rf[s], rel=1e-6)
    mean = (expected["a:0"] + expected["b:0"]) / 2
    assert rows["a:0"]["advantage"] == pytest.approx(expected["a:0"] - mean, rel=1e-12)


def test_kl_into_token_advantages(tmp_path):
    traces = [
        trace("a:0", "g", [1], [5, 6], completion_logprobs=[-0.5, -1.0]),
        trace("b:0", "g", [1], [7], completion_logprobs=[-0.2]),
    ]
    refs = [ref("a:0", [-0.7, -0.4]), ref("b:0", [-0.9])]
    store = make_store(str(tmp_path / "s"), traces, [reward("a:0", 1.0), reward("b:0", 0.0)], refs=refs)
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="advantages", kl_coef=0.5))
    rows = by_id(read_set(res))
    f = lambda v: float(np.float32(v))  # noqa: E731
    d = {"a:0": [f(-0.5) - f(-0.7), f(-1.0) - f(-0.4)], "b:0": [f(-0.2) - f(-0.9)]}
    mean_d = sum(d["a:0"] + d["b:0"]) / 3
    for s, adv in (("a:0", 0.5), ("b:0", -0.5)):
        assert rows[s]["advantage"] == adv
        assert rows[s]["token_advantages"] == pytest.approx([adv + 0.5 * (mean_d - x) for x in d[s]], rel=1e-6)
    assert res.statistics["kl"]["mean_log_ratio"] == pytest.approx(mean_d, rel=1e-12)


def test_kl_without_refs_is_usage_error(tmp_path):
    store = small_store(tmp_path)
    with pytest.raises(UsageError, match="no ref_logprobs table"):
        build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="column"))
    store.commit(
        "ref_logprobs", table(REF_LOGPROBS, [ref("a0:0", [-1.0, -1.0, -1.0]), ref("a1:0", [-1.0])]).to_batches()
    )
    with pytest.raises(UsageError, match=r"1 sample\(s\) have no reference logprobs \(e.g. b0:0\)"):
        build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="column"))
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="column", missing_ref="drop"))
    assert res.drops == {"missing_ref": 1, "ref_length_mismatch": 1} and res.rows == 1
    assert not os.path.exists(tmp_path / "out" / ".staging")


def test_groups_whole_target_and_seeded_shuffle(tmp_path):
    store = random_store(str(tmp_path / "s"), 30, 4)
    a = build_shards(store, str(tmp_path / "a"), options=ShardOptions(target_tokens=100, seed=1))
    b = build_shards(store, str(tmp_path / "b"), options=ShardOptions(target_tokens=100, seed=2))
    ta, tb = read_set(a), read_set(b)
    assert sorted(ta["sample_id"].to_pylist()) == sorted(tb["sample_id"].to_pylist())
    assert ta["sample_id"].to_pylist() != tb["sample_id"].to_pylist()
    seen: dict[str, str] = {}
    for s in a.shards:
        part = pq.read_table(os.path.join(a.set_dir, s["file"]))
        groups = part["group_id"].to_pylist()
        for g in set(groups):
            assert g not in seen, "a group was split across shards"
            seen[g] = s["file"]
        # groups are contiguous within a shard
        assert sum(1 for i in range(1, len(groups)) if groups[i] != groups[i - 1]) == len(set(groups)) - 1
        assert s["tokens"] < 100 + 4 * 20


def test_heads_auto_and_explicit_k(tmp_path):
    ids3 = [[5, 6, 7]]
    traces = [
        trace("h3:0", "g", [1], [5], topk_ids=ids3, topk_logprobs=[[-0.1, -2.0, -3.0]]),
        trace("h2:0", "g", [1], [5, 6], topk_ids=[[5, 6, 8], [6, 9]], topk_logprobs=[[-0.1, -2.0, -3.0], [-0.2, -1.0]]),
        trace("none:0", "g", [1], [5]),
        trace("topp:0", "g", [1], [5], top_p=0.9, topk_ids=ids3, topk_logprobs=[[-0.1, -2.0, -3.0]]),
    ]
    store = make_store(str(tmp_path / "s"), traces, [reward(t["sample_id"], 1.0) for t in traces])
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(topk="auto"))
    assert res.drops == {"missing_heads": 1, "truncated_sampling": 1}
    rows = by_id(read_set(res))
    assert rows["h3:0"]["topk_ids"] == [[5, 6]] and rows["h2:0"]["topk_ids"] == [[5, 6], [6, 9]]
    got = rows["h2:0"]["topk_logprobs"]
    assert [[float(np.float32(v)) for v in p] for p in ([-0.1, -2.0], [-0.2, -1.0])] == got
    manifest = json.loads(Path(res.manifest_path).read_text())
    assert manifest["heads"]["k"] == 2
    temperature = {"values": [{"value": 1.0, "rows": 2}], "unknown": 0}
    assert manifest["heads"]["sampling"]["temperature"] == manifest["sampling"]["temperature"] == temperature
    assert manifest["sampling"]["top_k"] == {"values": [], "unknown": 2}
    assert rows["h2:0"]["temperature"] == 1.0 and rows["h2:0"]["top_p"] == 1.0 and rows["h2:0"]["top_k"] is None
    res3 = build_shards(store, str(tmp_path / "out3"), options=ShardOptions(topk=3))
    assert res3.drops["heads_too_narrow"] == 1 and by_id(read_set(res3))["h3:0"]["topk_ids"] == ids3


def test_null_logprobs_stay_null_and_skip_kl(tmp_path):
    traces = [trace("a:0", "g", [1], [5, 6], completion_logprobs=[None, -1.0])]
    store = make_store(str(tmp_path / "s"), traces, [reward("a:0", 1.0)], refs=[ref("a:0", [-1.0, -2.0])])
    rows = by_id(
        read_set(build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="column", kl_estimator="k1")))
    )
    assert rows["a:0"]["behavior_logprobs"] == [None, -1.0]
    assert rows["a:0"]["kl"] == [None, 1.0]


def test_unsafe_positions_leave_the_loss_mask_and_are_counted(tmp_path):
    traces = [
        trace("a:0", "g", [1], [5, 6, 7], completion_logprobs=[None, -1.0, -0.5]),
        trace("b:0", "g", [1], [8, 9]),
        trace("c:0", "g", [1], [4], completion_logprobs=[float("nan")]),
    ]
    refs = [ref("a:0", [-1.0, -2.0, None]), ref("b:0", [-1.0, -1.0]), ref("c:0", [-1.0])]
    rewards = [reward("a:0", 1.0), reward("b:0", 0.0), reward("c:0", 0.5)]
    store = make_store(str(tmp_path / "s"), traces, rewards, refs=refs)
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="column", kl_estimator="k1"))
    rows = by_id(read_set(res))
    assert rows["a:0"]["loss_mask"] == [False, True, False] and rows["c:0"]["loss_mask"] == [False]
    assert rows["a:0"]["token_advantages"] == [0.0, 0.5, 0.0] and rows["c:0"]["token_advantages"] == [0.0]
    assert rows["a:0"]["kl"] == [None, 1.0, None] and rows["b:0"]["loss_mask"] == [True, True]
    manifest = json.loads(Path(res.manifest_path).read_text())
    assert manifest["statistics"]["unsafe_masked"] == {"tokens": 3, "samples": 2}


def test_dry_run_writes_nothing_and_empty_store(tmp_path):
    store = small_store(tmp_path)
    res = build_shards(store, str(tmp_path / "out"), dry_run=True)
    assert res.status == "dry_run" and res.rows == 3 and not os.path.exists(tmp_path / "out")
    from prl.store.tables import Store

    empty = build_shards(Store(str(tmp_path / "none")), str(tmp_path / "out"))
    assert empty.status == "nothing_new" and empty.exit_code == 0 and empty.rows == 0


@pytest.mark.parametrize("kl", ["advantages", "reward"])
def test_dry_run_with_kl_plans_what_a_build_ships(tmp_path, kl):
    store = varied_store(str(tmp_path / "s"))
    opts = ShardOptions(kl=kl, kl_coef=0.1, missing_ref="drop", target_tokens=120)
    planned = build_shards(store, str(tmp_path / "out"), options=opts, dry_run=True)
    assert planned.status == "dry_run" and not os.path.exists(tmp_path / "out")
    built = build_shards(store, str(tmp_path / "out"), options=opts)
    assert (planned.rows, planned.tokens, planned.drops) == (built.rows, built.tokens, built.drops)
    assert planned.rows > 0 and planned.drops == {"missing_ref": planned.drops["missing_ref"]}


def test_singleton_baseline_field_and_none(tmp_path):
    traces = [
        trace("a:0", "g1", [1], [2], model="m1"),
        trace("b:0", "g2", [1], [2], model="m1"),
        trace("c:0", "g3", [1], [2], model="m2"),
    ]
    store = make_store(str(tmp_path / "s"), traces, [reward("a:0", 1.0), reward("b:0", 3.0), reward("c:0", 5.0)])
    rows = by_id(read_set(build_shards(store, str(tmp_path / "o1"), options=ShardOptions(singleton_baseline="model"))))
    assert [rows[s]["advantage"] for s in ("a:0", "b:0", "c:0")] == [-1.0, 1.0, 0.0]
    res = build_shards(store, str(tmp_path / "o2"), options=ShardOptions(singleton_baseline="none"))
    assert {r["advantage"] for r in read_set(res).to_pylist()} == {0.0}
    assert res.statistics["groups_of_one_without_baseline"] == 3


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"advantge": "mean"}, "unknown key\\(s\\) in \\[shards\\]: advantge; known keys: advantage, allow_warn"),
        ({"advantage": "gae"}, "advantage: expected one of"),
        ({"kl": "reward"}, "needs kl_coef > 0"),
        ({"kl_coef": "x"}, "kl_coef: expected a number"),
        ({"topk": 0}, "topk"),
        ({"target_tokens": True}, "target_tokens: expected an integer"),
        ({"finish_reasons": ["stop", "halt"]}, "finish_reasons"),
        ({"rewards": {"a": float("nan")}}, "finite number"),
        ({"current_version": "latest"}, "no integer version"),
        ({"singleton_baseline": "prompt"}, "singleton_baseline"),
        ({"max_drop_rate": 2}, "max_drop_rate: expected a number in \\[0, 1\\], got 2"),
        ({"max_drop_rate": "lots"}, "max_drop_rate: expected a number in \\[0, 1\\], got 'lots'"),
        ({"kl_coef": -0.5}, "kl_coef: expected a number ≥ 0, got -0.5"),
        ({"kl_coef": float("inf")}, "kl_coef: expected a number ≥ 0, got inf"),
        ({"seed": -1}, "seed: expected an integer ≥ 0, got -1"),
        ({"seed": "1.5"}, "seed: expected an integer ≥ 0, got '1.5'"),
        ({"target_tokens": 0}, "target_tokens: expected an integer ≥ 1, got 0"),
        ({"min_completion_tokens": 0}, "min_completion_tokens: expected an integer ≥ 1, got 0"),
        ({"max_staleness": -2}, "max_staleness: expected an integer ≥ 0, got -2"),
        ({"allow_warn": "maybe"}, "allow_warn: expected true or false, got 'maybe'"),
        ({"allow_warn": 1}, "allow_warn: expected true or false, got 1"),
        ({"topk": "all"}, "topk: expected 'auto', an integer ≥ 1 or nothing, got 'all'"),
        ({"topk": True}, "topk: expected an integer ≥ 1, got True"),
        ({"finish_reasons": []}, "finish_reasons: keep at least one finish reason"),
        ({"finish_reasons": "stop,halt"}, "finish_reasons: expected names from stop, length"),
        ({"rewards": "a=1,b=x"}, "rewards: expected NAME=WEIGHT pairs"),
        ({"rewards": {"a": True}}, "rewards.a: expected a finite number, got True"),
        ({"rewards": 3}, "rewards: expected a table of name = weight"),
        ({"ref_model": ""}, "ref_model: expected a non-empty string"),
        ({"tokenizer_fingerprint": 7}, "tokenizer_fingerprint: expected a non-empty string, got 7"),
        ({"current_version": True}, "current_version: expected a version string or integer, got True"),
        ({"kl": None}, "kl: expected one of none, column, reward, advantages, got None"),
        ({"missing_ref": "skip"}, "missing_ref: expected one of error, drop, got 'skip'"),
    ],
)
def test_options_validation(mapping, message):
    with pytest.raises(UsageError, match=message) as info:
        ShardOptions.from_mapping(mapping)
    assert str(info.value).startswith(("[shards] ", "unknown key(s) in [shards]"))
    with pytest.raises(UsageError, match=r"^r\.toml: "):
        ShardOptions.from_mapping(mapping, where="r.toml")


def test_options_built_in_code_are_checked_by_the_same_rules():
    with pytest.raises(UsageError, match="advantage: expected one of mean, loo, std, got 'gae'"):
        ShardOptions(advantage="gae")
    with pytest.raises(UsageError, match="seed: expected an integer ≥ 0"):
        ShardOptions(seed=-3)
    assert ShardOptions(topk="7").topk == 7 and ShardOptions(finish_reasons=("stop", "stop")).finish_reasons == (
        "stop",
    )


def test_options_round_trip_and_cli_strings():
    opts = ShardOptions.from_mapping({"rewards": "score", "topk": "20", "allow_warn": "true", "kl_coef": "0.1"})
    assert opts.rewards == {"score": 1.0} and opts.topk == 20 and opts.allow_warn and opts.kl_coef == 0.1
    assert ShardOptions.from_mapping(opts.to_dict()) == opts
    assert opts.digest() == ShardOptions.from_mapping(json.loads(json.dumps(opts.to_dict()))).digest()


@pytest.mark.parametrize("kl", ["advantages", "reward"])
def test_bytes_do_not_depend_on_batches_blocks_or_threads(tmp_path, monkeypatch, kl):
    store = varied_store(str(tmp_path / "s"))
    opts = ShardOptions(kl=kl, kl_coef=0.1, missing_ref="drop", topk="auto", target_tokens=120, seed=3)
    first = build_shards(store, str(tmp_path / "a"), options=opts)
    monkeypatch.setattr(scan, "SCAN_BATCH_ROWS", 2)  # many spilled batches per shard
    monkeypatch.setattr(gather, "BLOCK_TOKENS", 5)  # many numeric blocks per shard
    monkeypatch.setattr(shards, "WORKERS", 1)
    monkeypatch.setattr(scores, "WORKERS", 1)
    second = build_shards(store, str(tmp_path / "b"), options=opts)
    assert len(first.shards) >= 3
    assert [s["sha256"] for s in first.shards] == [s["sha256"] for s in second.shards]
    assert first.statistics == second.statistics


def test_rows_gathered_from_spill_match_the_store(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "SCAN_BATCH_ROWS", 3)
    store = varied_store(str(tmp_path / "s"), seed=1)
    res = build_shards(
        store, str(tmp_path / "out"), options=ShardOptions(kl="column", missing_ref="drop", target_tokens=90)
    )
    got = by_id(read_set(res))
    traces = {r["sample_id"]: r for r in store.read("traces").to_pylist()}
    refs = {r["sample_id"]: r for r in store.read("ref_logprobs").to_pylist()}
    assert len(got) == res.rows == len(refs) and len(res.shards) >= 3
    for sid, row in got.items():
        t = traces[sid]
        assert row["input_ids"] == t["prompt_token_ids"] + t["completion_token_ids"]
        assert row["prompt_len"] == len(t["prompt_token_ids"])
        assert row["behavior_logprobs"] == t["completion_logprobs"]
        assert row["ref_logprobs"] == refs[sid]["ref_logprobs"]
        mask = t["completion_mask"] or [True] * len(t["completion_token_ids"])
        safe = [a is not None and b is not None for a, b in zip(t["completion_logprobs"], refs[sid]["ref_logprobs"])]
        assert row["loss_mask"] == [m and ok for m, ok in zip(mask, safe, strict=True)]  # safe values only
        expected_kl = [
            None if (a is None or b is None or not m) else float(np.float32(k3(float(a) - float(b))))
            for a, b, m in zip(t["completion_logprobs"], refs[sid]["ref_logprobs"], row["loss_mask"], strict=True)
        ]
        assert row["kl"] == expected_kl


def test_mean_log_ratio_over_mixed_samples_matches_numpy(tmp_path):
    """Samples whose tokens all count are summed during the plan scans, the others (a mask, a null logprob on
    either side) read again: the batch mean and every token advantage match a direct numpy computation."""
    store = varied_store(str(tmp_path / "s"), seed=2)
    beta = 0.25
    res = build_shards(
        store, str(tmp_path / "out"), options=ShardOptions(kl="advantages", kl_coef=beta, missing_ref="drop")
    )
    got = by_id(read_set(res))
    traces = {r["sample_id"]: r for r in store.read("traces").to_pylist()}
    refs = {r["sample_id"]: r for r in store.read("ref_logprobs").to_pylist()}
    d, valid = {}, {}
    for sid in got:
        t, r = traces[sid], refs[sid]["ref_logprobs"]
        mask = t["completion_mask"] or [True] * len(r)
        lp = np.array([np.nan if v is None else v for v in t["completion_logprobs"]], dtype=np.float32)
        rf = np.array([np.nan if v is None else v for v in r], dtype=np.float32)
        d[sid] = lp.astype(np.float64) - rf.astype(np.float64)
        valid[sid] = np.isfinite(d[sid]) & np.array(mask)
    simple = [sid for sid in got if valid[sid].all()]
    assert 0 < len(simple) < len(got), "the fixture must mix samples summed in the scans with samples read again"
    total = sum(float(d[s][valid[s]].sum()) for s in got)
    count = sum(int(valid[s].sum()) for s in got)
    mean_d = total / count
    assert res.statistics["kl"]["mean_log_ratio"] == pytest.approx(mean_d, rel=1e-12)
    for sid, row in got.items():
        expected = np.where(valid[sid], row["advantage"] + beta * (mean_d - np.nan_to_num(d[sid])), 0.0)
        expected = np.where(np.array(row["loss_mask"]) & ~valid[sid], row["advantage"], expected)
        np.testing.assert_allclose(row["token_advantages"], expected.astype(np.float32), rtol=1e-6, atol=1e-7)


logprob_rows = st.lists(
    st.lists(st.one_of(st.none(), st.floats(-30, 0, width=32), st.just(float("-inf"))), max_size=6), max_size=8
)
mask_rows = st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.booleans()), max_size=6)), max_size=8)


@settings(max_examples=150, deadline=None)
@given(logprob_rows, mask_rows, st.integers(0, 3))
def test_side_sums_of_a_scan_batch(rows, masks, cut):
    masks = (masks + [None] * len(rows))[: len(rows)]
    lists = pa.array(rows, pa.list_(pa.float32())).slice(min(cut, len(rows)))  # batches can be slices
    mask_lists = pa.array(masks, pa.list_(pa.bool_())).slice(min(cut, len(rows)))
    sums, simple = side_sums(lists, mask_lists)
    for i, (row, mask) in enumerate(zip(rows[cut:], masks[cut:], strict=True)):
        finite = all(v is not None and math.isfinite(v) for v in row)
        assert simple[i] == (finite and (mask is None or all(m is True for m in mask)))
        if finite:
            assert sums[i] == pytest.approx(math.fsum(float(np.float32(v)) for v in row), abs=1e-9)
    assert side_sums(lists)[1].tolist() == [all(v is not None and math.isfinite(v) for v in row) for row in rows[cut:]]


def k3(d: float) -> float:
    x = min(max(-d, -20.0), 20.0)
    return min(math.expm1(x) - x, 10.0)


def test_a_shard_write_failing_midway_publishes_nothing(tmp_path, monkeypatch):
    import errno

    store = random_store(str(tmp_path / "s"), 40, 4)  # 160 samples, several shards
    out = tmp_path / "out"
    from prl.shards import parts, rowgroups

    calls = []

    class DiskFullOnTheThird(parts.ShardWriter):
        def write(self, table):
            calls.append(table.num_rows)
            if len(calls) == 3:
                raise OSError(errno.ENOSPC, "No space left on device")
            super().write(table)

    monkeypatch.setattr(parts, "ShardWriter", DiskFullOnTheThird)
    monkeypatch.setattr(rowgroups, "ROW_GROUP_TOKENS", 20)  # several row groups a shard: it fails inside one
    with pytest.raises(OSError, match="No space left on device"):
        build_shards(store, str(out), options=ShardOptions(target_tokens=50))
    assert len(calls) >= 3
    assert sorted(os.listdir(out)) == []  # no set, no staging folder, no index
    monkeypatch.undo()
    result = build_shards(store, str(out), options=ShardOptions(target_tokens=50))
    assert (result.status, result.rows) == ("built", 160)
    from prl.shards.verify import verify_shards

    assert verify_shards(str(out)).exit_code == 0


def test_the_one_reward_name_in_the_table_is_the_score(tmp_path):
    traces = [trace("a:0", "g", [1], [5]), trace("b:0", "g", [1], [6])]
    rewards = [reward("a:0", 1.0, name="pass_rate"), reward("b:0", 0.0, name="pass_rate")]
    res = build_shards(make_store(str(tmp_path / "s"), traces, rewards), str(tmp_path / "out"))
    assert res.status == "built" and res.exit_code == 0
    assert {sid: row["reward"] for sid, row in by_id(read_set(res)).items()} == {"a:0": 1.0, "b:0": 0.0}
    assert json.loads(Path(res.manifest_path).read_text())["options"]["rewards"] == {"pass_rate": 1.0}


def test_several_reward_names_and_none_chosen_is_a_usage_error(tmp_path):
    traces = [trace("a:0", "g", [1], [5])]
    rewards = [reward("a:0", 1.0, name="pass"), reward("a:0", 0.2, name="style")]
    store = make_store(str(tmp_path / "s"), traces, rewards)
    with pytest.raises(UsageError, match=r"2 reward names \(pass, style\)"):
        build_shards(store, str(tmp_path / "out"))
    chosen = build_shards(store, str(tmp_path / "out"), options=ShardOptions(rewards={"style": 1.0}))
    assert chosen.status == "built" and by_id(read_set(chosen))["a:0"]["reward"] == 0.2


def test_a_build_that_drops_every_sample_exits_1_naming_the_reason(tmp_path):
    store = small_store(tmp_path)
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(rewards={"other": 1.0}))
    assert (res.status, res.exit_code, res.rows) == ("all_dropped", 1, 0)
    assert res.headline() == (
        "build-shards all_dropped: every new sample was dropped: 3 of 3 as missing_reward (the score uses reward other)"
    )
    assert not os.path.exists(tmp_path / "out")
    assert build_shards(store, str(tmp_path / "out")).status == "built"  # the table's one name: reward
