"""The whole pipeline over sample_data/ finds exactly what sample_data/README.md says is planted there."""

from __future__ import annotations

import os

import polars as pl
import pytest

from prl.checks import check_tokens
from prl.ingestion.side_tables import ingest_side_table
from prl.ingestion.traces import ingest
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.store.tables import Store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "sample_data")


@pytest.fixture(scope="module")
def checked_store(tmp_path_factory, tokenizer_dir) -> Store:
    store = Store(str(tmp_path_factory.mktemp("sample") / "store"))
    result = ingest(
        [os.path.join(DATA, "traces"), os.path.join(DATA, "bad")],
        store,
        finish_reason="stop",
        max_quarantine_rate=None,
        partial_line_grace=0,  # a fresh checkout's files are young; bad/truncated.jsonl is not being written
    )
    # 118 samples from the 13 trace files; bad/ adds 2 records identical to ones already read (present) and
    # 6 quarantined records, each with the reason the README plants
    assert (result.samples, result.already_present) == (118, 2)
    assert result.quarantined == {
        "truncated_line": 1,
        "nonfinite_logprob": 1,
        "length_mismatch": 1,
        "no_token_ids": 2,
        "duplicate_sample_id": 1,
    }
    rewards = ingest_side_table(
        [os.path.join(DATA, "rewards.jsonl"), os.path.join(DATA, "rewards.csv")], store, kind="rewards"
    )
    assert (rewards.rows, rewards.quarantined) == (159 + 14, {"nonfinite_reward": 2, "missing_value": 2})
    check_tokens(store, tokenizer_dir, chat_template="deepseek_v4")
    return store


def _verdicts(store: Store) -> pl.DataFrame:
    checks = pl.read_delta(store.table_uri("checks"))
    traces = pl.read_delta(store.table_uri("traces")).select("sample_id", "session_id", "turn", "source_format")
    return checks.join(traces, on="sample_id")


def test_sessions_classified_as_planted(checked_store):
    df = _verdicts(checked_store)
    flagged = df.filter(pl.col("prefix_status").is_in(["REALIGN", "FORK"])).sort("session_id", "turn")
    assert flagged.select("session_id", "turn", "prefix_status", "verdict").rows() == [
        ("sess-multi-79fac48c5e12", None, "FORK", "note"),  # the worker's earlier reasoning stripped from history
        ("sess-thinking-d090d62f8916", 1, "FORK", "note"),  # reasoning stripped from history
        ("sess-thinking-d090d62f8916", 2, "FORK", "note"),
        ("sess-trailing-3406b735ee18", 1, "REALIGN", "note"),  # trailing '\n\n' trimmed by the client
    ]
    # every other later turn (trivia, code, agent, the trailing session's last turn, the proxy session, and in the
    # multi-agent session 2 of the planner's and 2 of the worker's) is clean
    assert df.filter(pl.col("prefix_status") == "CLEAN").height == 8 + 4


def test_verdict_counts_and_the_floored_logprob(checked_store):
    df = _verdicts(checked_store)
    assert dict(df.group_by("verdict").len().rows()) == {"ok": 113, "note": 4, "invalid": 1}
    invalid = df.filter(pl.col("verdict") == "invalid").row(0, named=True)
    # vllm_completions.jsonl.gz holds one token at vLLM's -9999.0 floor: stored as null, flagged, never 0.0
    assert invalid["source_format"] == "openai_completions"
    assert invalid["first_divergence"] == 2
    assert "logprob_missing" in invalid["reasons"]


def test_keep_think_template_drifts_where_history_holds_reasoning(checked_store, tokenizer_dir):
    result = check_tokens(checked_store, tokenizer_dir, chat_template="deepseek_v4_keep_think", dry_run=True)
    # two prompts of vllm_chat.jsonl, and the multi-agent worker's two calls after its reasoning answer
    assert result.reasons.get("template_prompt") == 2 + 2


def test_multi_agent_session_is_checked_per_agent(checked_store):
    checks = pl.read_delta(checked_store.table_uri("checks")).select("sample_id", "prefix_status")
    traces = pl.read_delta(checked_store.table_uri("traces")).filter(pl.col("session_id").str.starts_with("sess-multi"))
    got = traces.join(checks, on="sample_id").sort("created_at").select("agent_id", "prefix_status").rows()
    assert got == [
        ("planner", None),
        ("worker", None),
        ("worker", "CLEAN"),
        ("planner", "CLEAN"),
        ("worker", "FORK"),  # the worker's history dropped its earlier reasoning; the planner is not touched
        ("worker", "CLEAN"),
        ("planner", "CLEAN"),
    ]
    # all calls were answered within one second: the capture's milliseconds order them
    assert traces.get_column("created_at").dt.truncate("1s").n_unique() == 1


def test_merged_rows_of_the_multi_agent_session(checked_store, tmp_path):
    options = ShardOptions(rewards={"correct": 1.0}, allow_warn=True, merge_turns=True)
    res = build_shards(checked_store, str(tmp_path / "out"), options=options)
    rows = {r["sample_id"]: r for r in pl.read_parquet(os.path.join(res.set_dir, "*.parquet")).to_dicts()}
    traces = (
        pl.read_delta(checked_store.table_uri("traces"))
        .filter(pl.col("session_id").str.starts_with("sess-multi"))
        .sort("created_at")
    )
    turns = {agent: traces.filter(pl.col("agent_id") == agent).to_dicts() for agent in ("planner", "worker")}
    planner, worker = turns["planner"], turns["worker"]
    # the planner's three CLEAN calls are one row; the worker's FORK call drifted and was dropped, so its two calls
    # before it are one row and the call after it starts another
    expected = [planner, worker[:2], worker[3:]]
    for members in expected:
        row, last = rows[members[0]["sample_id"]], members[-1]
        assert row["input_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
        assert row["prompt_len"] == len(members[0]["prompt_token_ids"])
        sampled = [False] * (len(row["input_ids"]) - row["prompt_len"])
        lps: list[float | None] = [None] * len(sampled)
        for t in members:  # each call's completion sits at the end of its own prompt in the merged row
            start = len(t["prompt_token_ids"]) - row["prompt_len"]
            for j, lp in enumerate(t["completion_logprobs"]):
                sampled[start + j], lps[start + j] = True, lp
        assert row["loss_mask"] == sampled
        assert row["behavior_logprobs"] == pytest.approx(lps)
    for t in planner[1:] + worker[1:2] + worker[2:3] + worker[4:]:
        assert t["sample_id"] not in rows  # inside a merged row, or dropped
    assert res.statistics["merged_turns"]["rows"] == len(rows)


def test_the_demo_recipe_comments_say_what_the_demo_quarantines(checked_store):
    """recipes/demo.toml explains its quarantine threshold with the counts the demo's ingest reports."""
    quarantine = pl.read_delta(checked_store.table_uri("quarantine"))
    traces_bad = quarantine.filter(pl.col("table") == "traces").height
    rewards_bad = quarantine.filter(pl.col("table") == "rewards").height
    samples = pl.read_delta(checked_store.table_uri("traces")).height
    rate = traces_bad / (samples + traces_bad)  # as ingest's quarantine_rate counts it
    with open(os.path.join(REPO, "recipes", "demo.toml"), encoding="utf-8") as fh:
        comments = " ".join(line.lstrip("# ").strip() for line in fh if line.startswith("#"))
    assert (traces_bad, rewards_bad, samples) == (6, 4, 118)
    assert (
        f"{traces_bad} are quarantined with a reason, {100 * rate:.2f} % of the {samples + traces_bad} samples and "
        "quarantined records"
    ) in comments
    assert f"The rewards step quarantines {rewards_bad} more" in comments
