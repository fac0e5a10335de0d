"""KL tokens at the k3 cap: counted in a build's statistics, and a warning when more than a tenth sit there."""

from __future__ import annotations

import logging

import pyarrow as pa

from prl.shards.build import build_shards
from prl.shards.merge_build import kl_totals
from prl.shards.options import ShardOptions
from prl.shards.statistics import kl_cap_warning
from tests.shards_fixtures import make_store, ref, reward, trace

LP = {"a:0": [-0.5, -1.0, -0.1], "b:0": [-0.2]}
REF = {"a:0": [-0.7, -30.0, -0.2], "b:0": [-0.9]}  # log ratios 0.2, 29 (k3 = min(19, 10): the cap), 0.1; 0.7


def _store(tmp_path):
    traces = [trace(s, "g", [1], [5] * len(v), completion_logprobs=v) for s, v in LP.items()]
    refs = [ref(s, v) for s, v in REF.items()]
    return make_store(str(tmp_path / "s"), traces, [reward("a:0", 1.0), reward("b:0", 0.0)], refs=refs)


def test_a_build_counts_the_kl_tokens_at_the_k3_cap_and_warns(tmp_path, caplog):
    store = _store(tmp_path)
    with caplog.at_level(logging.WARNING, logger="prl.shards.build"):
        res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="column", kl_estimator="k3"))
    kl = res.statistics["kl"]
    assert (kl["tokens"], kl["at_cap"]) == (4, 1)
    expected = (
        "1 of 4 KL tokens (25%) sit at the k3 cap of 10: there the penalty no longer grows with the gap between the "
        "sampling policy and the reference (is ref_model the policy's reference model?)"
    )
    assert res.warnings() == [expected]
    assert res.to_json()["warnings"] == [expected]
    assert [r.getMessage() for r in caplog.records] == [f"set {res.set_id}: {expected}"]


def test_other_estimators_have_no_cap(tmp_path, caplog):
    store = _store(tmp_path)
    with caplog.at_level(logging.WARNING, logger="prl.shards.build"):
        res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(kl="column", kl_estimator="k2"))
    assert (res.statistics["kl"]["tokens"], res.statistics["kl"]["at_cap"]) == (4, None)
    assert res.warnings() == [] and caplog.records == []


def test_merged_rows_count_their_capped_values():
    shard = pa.table({"kl": pa.array([[10.0, 1.5], [10.0], None, [9.999]], pa.list_(pa.float32()))})
    assert kl_totals(shard) == (10.0 + 1.5 + 10.0 + float(pa.scalar(9.999, pa.float32()).as_py()), 4, 2)
    assert kl_totals(shard, "k1")[2] == 0


def test_the_warning_starts_above_a_tenth():
    assert kl_cap_warning({"tokens": 100, "at_cap": 10}) is None
    assert kl_cap_warning({"tokens": 100, "at_cap": 11}).startswith("11 of 100 KL tokens (11%) sit at the k3 cap")
    assert kl_cap_warning({"tokens": 0, "at_cap": 0}) is None
    assert kl_cap_warning({"tokens": 5, "at_cap": None}) is None  # k1, k2
    assert kl_cap_warning(None) is None
