"""``prl run`` with ``[score_ref]`` then ``[shards] kl = "advantages"``: the shards' KL terms come from the reference
model the recipe scores with, and no file of reference logprobs is needed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prl.errors import UsageError
from prl.pipeline import recipe as recipes
from prl.pipeline.runner import run
from tests.pipeline_helpers import write_recipe
from tests.score_helpers import Reference, build_tiny_model, write_traces

pytest.importorskip("torch")


@pytest.mark.slow
def test_recipe_scores_then_builds_kl_shards(tmp_path):
    folder = build_tiny_model(tmp_path / "model")
    samples = write_traces(tmp_path / "in", 8, seed=5)
    with open(tmp_path / "rewards.jsonl", "w") as fh:
        for k, sample_id in enumerate(sorted(samples)):
            fh.write(json.dumps({"sample_id": sample_id, "reward": float(k % 2)}) + "\n")
    recipe = write_recipe(
        tmp_path / "recipe.toml",
        {
            "store": {"uri": "store", "out": "out"},
            "ingest": {"sources": ["in"]},
            "rewards": {"sources": ["rewards.jsonl"]},
            "score_ref": {"ref_model": "tiny-ref", "model": "model", "batch_tokens": 256},
            "shards": {"kl": "advantages", "kl_coef": 0.1, "kl_estimator": "k1", "require_checks": False},
        },
    )
    loaded = recipes.load(str(recipe))
    assert loaded.steps == ("ingest", "rewards", "score_ref", "shards")
    assert loaded.shards is not None and loaded.shards.ref_model == "tiny-ref"  # defaults to the scored model
    first = run(str(recipe))
    assert first.exit_code == 0, first.to_json()
    assert first.step("score_ref").summary["scored"] == len(samples)
    shard_dir = first.step("shards").summary["set_dir"]
    table = pa.concat_tables(pq.read_table(p) for p in sorted(Path(shard_dir).glob("part-*.parquet")))
    assert sorted(table.column("sample_id").to_pylist()) == sorted(samples)
    ref = Reference(folder)
    for row in table.to_pylist():
        prompt, completion = samples[row["sample_id"]]
        want = ref.completion(prompt, completion)
        np.testing.assert_allclose(row["ref_logprobs"], want, atol=1e-5, rtol=0)
        behaviour = np.array(row["behavior_logprobs"], np.float32)
        np.testing.assert_allclose(row["kl"], behaviour - np.array(row["ref_logprobs"], np.float32), atol=1e-6)
    again = run(str(recipe))
    assert again.exit_code == 0 and again.step("score_ref").summary["scored"] == 0
    only = run(str(recipe), steps=["score-ref"])
    assert [s.step for s in only.steps] == ["score_ref"]
    write_traces(tmp_path / "in", 1, seed=6)  # a new sample, so the model is needed again
    (tmp_path / "model" / "config.json").unlink()  # a model folder that is gone: the step fails, exit 2
    gone = run(str(recipe), steps=["ingest", "score_ref"])
    assert gone.exit_code == 2 and "config.json" in (gone.step("score_ref").error or "")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"ref_model": "r"}, "exactly one of endpoint and model"),
        ({"ref_model": "r", "endpoint": "http://x", "model": "."}, "exactly one of endpoint and model"),
        ({"endpoint": "http://x"}, "needs ref_model"),
        (
            {"ref_model": "r", "endpoint": "http://x", "concurrency": 0},
            "concurrency: expected an integer in [1, 4096], got 0",
        ),
        ({"ref_model": "r", "endpoint": "http://x", "timeout": -1}, "timeout: expected a number in (0, 86400], got -1"),
        ({"ref_model": "r", "endpoint": "http://x", "batch": 3}, "unknown key(s) in [score_ref]: batch"),
        (
            {"ref_model": "r", "endpoint": "http://x", "backend": "tinker"},
            'backend = "tinker" needs endpoint and served_model',
        ),
        ({"ref_model": "r", "endpoint": "http://x", "backend": "tgi"}, "backend"),
    ],
)
def test_bad_score_ref_tables(tmp_path, table, message):
    path = write_recipe(tmp_path / "r.toml", {"store": {"uri": "s"}, "score_ref": table})
    with pytest.raises(
        UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        recipes.load(str(path))
