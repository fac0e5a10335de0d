"""Which verdicts a default build keeps: information about IDs as sampled ships, wrong tokens do not.

Checked with the real DeepSeek-V4 tokenizer, then built with the default options; every reason stays in
``checks``, in the build's ``drops`` and in the manifest's ``check_reasons``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from prl.checks import check_tokens
from prl.schema import REWARDS
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from tests.checks_helpers import EOS, chat_prompt, enc, make_store, row, tokenizer_dir
from tests.shards_fixtures import make_store as make_shard_store
from tests.shards_fixtures import reward, trace

T0 = datetime(2025, 1, 1, tzinfo=UTC)
BOS = enc("<｜begin▁of▁sentence｜>")
PROMPT = chat_prompt("Greet the world")
GOOD = [*enc("Hello world."), EOS]
PAD = 2
"""<｜▁pad▁｜>, a special token (special=True)."""


def _rows() -> list[dict]:
    split = enc("Sure:\n") + enc("Hel") + enc("lo world.") + [EOS]
    text_prompt = BOS + enc("Protect your face.")
    skin = [*enc("skin"), *enc(" care"), EOS]
    mid = [*enc("Hi"), PAD, *enc(" there"), EOS]
    split_prompt = BOS + enc("sys<｜User｜>") + enc("Hel") + enc("lo") + enc("<｜Assistant｜></think>")
    return [
        row("clean", PROMPT, GOOD),
        row("split", PROMPT, split),
        row("boundary", text_prompt, skin, source_format="vllm_completions"),
        row("mid", PROMPT, mid),
        row("nostop", PROMPT, GOOD[:-1], [-0.25] * (len(GOOD) - 1)),
        row("prompt", split_prompt, GOOD),
        row("oov", PROMPT, [*enc("Hello"), 129280, EOS]),
        row("zeros", PROMPT, GOOD, [0.0] * len(GOOD)),
    ]


EXPECTED = {
    "clean": ("ok", []),
    "split": ("note", ["roundtrip_completion"]),
    "boundary": ("note", ["roundtrip_boundary"]),
    "mid": ("note", ["special_mid_completion"]),
    "nostop": ("note", ["special_no_stop"]),
    "prompt": ("drift", ["roundtrip_prompt"]),
    "oov": ("invalid", ["vocab_completion"]),
    "zeros": ("drift", ["logprob_placeholder"]),
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdicts") / "store"
    store = make_store(str(root), _rows())
    rewards = [
        {"sample_id": r["sample_id"], "name": "reward", "value": float(i % 2), "created_at": T0}
        | {"source_uri": "mem://rewards", "source_line": i, "ingested_at": T0}
        for i, r in enumerate(_rows())
    ]
    store.commit("rewards", pa.Table.from_pylist(rewards, schema=REWARDS).to_batches())
    result = check_tokens(store, tokenizer_dir())
    return store, result


def _manifest(result) -> dict:
    return json.loads(Path(result.manifest_path).read_text())


def test_verdicts_of_each_case(checked):
    store, result = checked
    got = {r["sample_id"]: (r["verdict"], r["reasons"]) for r in store.read("checks").to_pylist()}
    assert got == EXPECTED
    assert result.verdicts == {"ok": 1, "note": 4, "warn": 0, "drift": 2, "invalid": 1}
    assert result.drift_rate == 3 / 8


def test_default_build_keeps_what_was_sampled_and_drops_wrong_tokens(checked, tmp_path):
    store, _ = checked
    res = build_shards(store, str(tmp_path / "out"))
    assert res.drops == {"verdict_drift": 2, "verdict_invalid": 1}
    assert res.rows == 5
    manifest = _manifest(res)
    assert manifest["check_reasons"] == {
        "roundtrip_boundary": 1,
        "roundtrip_completion": 1,
        "special_mid_completion": 1,
        "special_no_stop": 1,
    }
    assert manifest["options"]["drop_checks"] is None


def test_a_recipe_can_still_drop_any_reason(checked, tmp_path):
    store, _ = checked
    options = ShardOptions.from_mapping({"drop_checks": ["roundtrip_completion", "special_no_stop"]})
    res = build_shards(store, str(tmp_path / "out"), options=options)
    assert res.drops == {"verdict_drift": 2, "verdict_invalid": 1, "check_reason": 2}
    assert res.rows == 3
    manifest = _manifest(res)
    assert manifest["check_reasons"] == {"roundtrip_boundary": 1, "special_mid_completion": 1}
    assert manifest["options"]["drop_checks"] == ["roundtrip_completion", "special_no_stop"]


def test_checks_written_under_the_old_grades_are_read_as_graded_now(tmp_path):
    """A store checked when roundtrip_completion was drift and special tokens were warn: its stored verdicts are
    regraded from their reasons; a reason the table does not know keeps the stored verdict."""
    traces = [trace(f"s{i}:0", f"g{i}", [1], [2]) for i in range(5)]
    rewards = [reward(t["sample_id"], 1.0) for t in traces]
    stored = [
        ("drift", ["roundtrip_completion"]),
        ("warn", ["special_mid_completion", "special_no_stop"]),
        ("drift", ["roundtrip_prompt", "special_no_stop"]),
        ("drift", ["roundtrip_completion", "a_reason_from_elsewhere"]),
        ("warn", ["template_error"]),
    ]
    checks = [
        {"sample_id": t["sample_id"], "tokenizer_fingerprint": "tok-a", "verdict": v, "reasons": rs, "checked_at": T0}
        for t, (v, rs) in zip(traces, stored, strict=True)
    ]
    store = make_shard_store(str(tmp_path / "s"), traces, rewards, checks)
    res = build_shards(store, str(tmp_path / "out"))
    assert res.drops == {"verdict_warn": 1, "verdict_drift": 2}
    assert res.rows == 2
    assert _manifest(res)["check_reasons"] == {
        "roundtrip_completion": 1,
        "special_mid_completion": 1,
        "special_no_stop": 1,
    }


def test_a_fork_is_dropped_where_turns_are_merged_only(tmp_path):
    traces = [trace(f"t{i}:0", f"g{i}", [1, 2], [3]) for i in range(3)]
    rewards = [reward(t["sample_id"], 1.0) for t in traces]
    checks = [
        {"sample_id": "t0:0", "tokenizer_fingerprint": "tok-a", "verdict": "ok", "reasons": [], "checked_at": T0},
        {"sample_id": "t1:0", "tokenizer_fingerprint": "tok-a", "verdict": "note", "reasons": ["prefix_fork"]}
        | {"prefix_status": "FORK", "checked_at": T0},
        {"sample_id": "t2:0", "tokenizer_fingerprint": "tok-a", "verdict": "note", "reasons": ["prefix_realign"]}
        | {"prefix_status": "REALIGN", "checked_at": T0},
    ]
    store = make_shard_store(str(tmp_path / "s"), traces, rewards, checks)
    alone = build_shards(store, str(tmp_path / "a"))
    assert (alone.drops, alone.rows) == ({}, 3)
    merged = build_shards(store, str(tmp_path / "m"), options=ShardOptions(merge_turns=True))
    assert (merged.drops, merged.rows) == ({"check_reason": 1}, 2)
    kept = build_shards(store, str(tmp_path / "k"), options=ShardOptions(merge_turns=True, drop_checks=[]))
    assert (kept.drops, kept.rows) == ({}, 3)


def test_unknown_reason_in_a_recipe_is_refused():
    from prl.errors import UsageError

    with pytest.raises(UsageError, match=r"\[shards\] drop_checks: .*got 'roundtrip_everything'"):
        ShardOptions.from_mapping({"drop_checks": ["roundtrip_everything"]})
