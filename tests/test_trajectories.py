"""Trajectories (session, agent): order within a trajectory, per-agent prefix checks, undeterminable predecessors,
and where the agent comes from in real records."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prl.checks import check_tokens
from prl.formats.agents import agent_of
from prl.formats.base import Sample
from prl.formats.fields import finer_time, timestamp_ms, timestamp_us
from prl.ingestion.traces import ingest
from prl.store.tables import Store
from prl.trajectory import order_steps, trajectory_order, with_order_keys
from tests.checks_helpers import EOS, chat_prompt, enc, make_store, row, tokenizer_dir

SECOND = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
P0 = chat_prompt("Plan the trip.")
Q0 = chat_prompt("Book the hotel.", "You are a worker.")


def reply(text: str) -> list[int]:
    return [*enc(text), EOS]


def user(text: str) -> list[int]:
    return enc(f"<｜User｜>{text}<｜Assistant｜></think>")


def chain(prompt: list[int], replies: list[list[int]], users: list[list[int]]) -> list[tuple[list[int], list[int]]]:
    """(prompt, completion) per turn of a history that extends exactly."""
    out = []
    for i, completion in enumerate(replies):
        out.append((prompt, completion))
        if i < len(users):
            prompt = prompt + completion + users[i]
    return out


def checked(tmp_path, rows, **kwargs):
    store = make_store(tmp_path, rows)
    result = check_tokens(store, tokenizer_dir(), **kwargs)
    got = {r["sample_id"]: r for r in store.read("checks").to_pylist()}
    return result, {k: (v["verdict"], v["reasons"], v["prefix_status"]) for k, v in got.items()}, got


def at(ms: int) -> datetime:
    return SECOND + timedelta(milliseconds=ms)


# --- order within a trajectory ------------------------------------------------------------------------------


def test_turns_sampled_in_the_same_second_are_ordered_by_arrival_and_checked(tmp_path):
    day_two = reply("On day two we visit the old town, the harbour and the market.")
    turns = chain(P0, [reply("Day one."), day_two, reply("Day three.")], [user("More"), user("More")])
    rows = [row(f"t{i}", p, c, session_id="s", created_at=SECOND, source_line=i + 1) for i, (p, c) in enumerate(turns)]
    # an edited history in the same second: the third turn's prompt holds a different second answer
    edited = turns[1][0] + reply("On day two we take the train to the mountains and stay there.") + user("More")
    rows.append(row("t2x", edited, reply("x"), session_id="s-edit", created_at=SECOND, source_line=10))
    rows += [
        row("e0", turns[0][0], turns[0][1], session_id="s-edit", created_at=SECOND, source_line=8),
        row("e1", turns[1][0], turns[1][1], session_id="s-edit", created_at=SECOND, source_line=9),
    ]
    result, got, _ = checked(tmp_path, rows)
    assert got["t0"] == ("ok", [], None)
    assert got["t1"] == ("ok", [], "CLEAN")
    assert got["t2"] == ("ok", [], "CLEAN")
    assert got["e1"] == ("ok", [], "CLEAN")
    assert got["t2x"] == ("note", ["prefix_fork"], "FORK")
    assert result.prefix == {"CLEAN": 3, "REALIGN": 0, "FORK": 1}
    assert result.prefix_undetermined == {}


def test_milliseconds_order_rows_that_arrived_out_of_order(tmp_path):
    turns = chain(P0, [reply("A."), reply("B."), reply("C.")], [user("Go"), user("Go")])
    # arrival order is reversed; the request side's milliseconds say the truth
    rows = [
        row("m2", *turns[2], session_id="s", created_at=at(830), source_line=1),
        row("m1", *turns[1], session_id="s", created_at=at(420), source_line=2),
        row("m0", *turns[0], session_id="s", created_at=at(7), source_line=3),
    ]
    _, got, _ = checked(tmp_path, rows)
    assert got["m1"] == ("ok", [], "CLEAN") and got["m2"] == ("ok", [], "CLEAN")
    assert got["m0"] == ("ok", [], None)


def test_a_whole_second_in_the_store_makes_its_trajectory_compare_at_seconds(tmp_path):
    # The store reads times back in microseconds; a whole second still marks the trajectory as seconds-only, so
    # arrival orders these three turns (at millisecond resolution b would come first and a would fork).
    turns = chain(P0, [reply("A."), reply("B."), reply("C.")], [user("Go"), user("Go")])
    rows = [
        row("a", *turns[0], session_id="s", created_at=at(500), source_line=1),
        row("b", *turns[1], session_id="s", created_at=SECOND, source_line=2),
        row("c", *turns[2], session_id="s", created_at=at(900), source_line=3),
    ]
    _, got, _ = checked(tmp_path, rows)
    assert (got["a"], got["b"], got["c"]) == (("ok", [], None), ("ok", [], "CLEAN"), ("ok", [], "CLEAN"))


@pytest.mark.parametrize(
    ("first_us", "second_us"),
    [
        # both finer than a millisecond: the microseconds order them, against arrival
        (250_300, 250_700),
        # the second turn's time is a whole millisecond (a source that keeps milliseconds): at microseconds it would
        # come first and the first turn would fork; at milliseconds the two tie and arrival decides
        (250_700, 250_000),
    ],
)
def test_turns_within_one_millisecond_compare_at_the_finest_resolution_every_row_has(tmp_path, first_us, second_us):
    turns = chain(P0, [reply("A."), reply("B.")], [user("Go")])
    line = {"u0": 1, "u1": 2} if first_us > second_us else {"u0": 2, "u1": 1}  # arrival disagrees with the µs
    rows = [
        row(
            "u0",
            *turns[0],
            session_id="s",
            created_at=SECOND + timedelta(microseconds=first_us),
            source_line=line["u0"],
        ),
        row(
            "u1",
            *turns[1],
            session_id="s",
            created_at=SECOND + timedelta(microseconds=second_us),
            source_line=line["u1"],
        ),
    ]
    _, got, _ = checked(tmp_path, rows)
    assert (got["u0"], got["u1"]) == (("ok", [], None), ("ok", [], "CLEAN"))


def keys(**columns) -> pl.DataFrame:
    n = len(columns["sample_id"])
    base = {
        "request_id": columns["sample_id"],
        "session_id": ["s"] * n,
        "agent_id": [None] * n,
        "turn": [None] * n,
        "created_at": [None] * n,
        "source_uri": ["file:///a.jsonl"] * n,
        "source_line": list(range(1, n + 1)),
        "prompt_len": [None] * n,
    }
    base.update(columns)
    schema = {
        "sample_id": pl.String,
        "request_id": pl.String,
        "session_id": pl.String,
        "agent_id": pl.String,
        "turn": pl.Int32,
        "created_at": pl.Int64,
        "source_uri": pl.String,
        "source_line": pl.Int64,
        "prompt_len": pl.Int64,
    }
    return pl.DataFrame(base, schema=schema).with_columns(pl.col("created_at").cast(pl.Datetime("ms", "UTC")))


def previous_of(df: pl.DataFrame) -> dict[str, tuple[list[str] | None, str | None]]:
    out = order_steps(with_order_keys(df))
    return {r["sample_id"]: (r["previous"], r["undetermined"]) for r in out.to_dicts()}


def test_a_whole_second_time_makes_the_trajectory_compare_at_seconds():
    # b's time is a whole second (OpenAI `created`); a and c carry milliseconds within that second.
    # At millisecond resolution b (12:00:00.000) would come first; at seconds, arrival decides.
    base = 1767268800000
    df = keys(sample_id=["a", "b", "c"], created_at=[base + 500, base, base + 900])
    assert previous_of(df) == {"b": (["a"], None), "c": (["b"], None)}
    # all milliseconds: the times decide, not arrival
    df = keys(sample_id=["a", "b", "c"], created_at=[base + 500, base + 1, base + 900])
    assert previous_of(df) == {"a": (["b"], None), "c": (["a"], None)}


def test_explicit_turns_win_and_samples_of_one_turn_are_one_step():
    df = keys(sample_id=["x1", "x0a", "x0b", "x3"], turn=[1, 0, 0, 3], created_at=[1, 9, 9, 2])
    # turn 3 follows turn 1 (turns may skip numbers: a session-wide counter shared by agents)
    assert previous_of(df) == {"x1": (["x0a", "x0b"], None), "x3": (["x1"], None)}


def test_ties_on_time_and_line_go_to_the_shorter_prompt():
    # one rollout line holding three calls: same time, file and line; prompt length orders them
    df = keys(
        sample_id=["long", "short", "mid"],
        source_line=[4, 4, 4],
        created_at=[5000, 5000, 5000],
        prompt_len=[90, 10, 40],
    )
    assert previous_of(df) == {"mid": (["short"], None), "long": (["mid"], None)}


def test_choices_of_one_record_are_one_step():
    df = keys(
        sample_id=["r1-0", "r1-1", "r2-0"],
        request_id=["r1", "r1", "r2"],
        source_line=[1, 1, 2],
        created_at=[5000, 5000, 5000],
    )
    assert previous_of(df) == {"r2-0": (["r1-0", "r1-1"], None)}


def test_undeterminable_predecessors_are_named():
    df = pl.concat(
        [
            keys(sample_id=["t0", "t1", "tn"], turn=[0, 1, None]),
            keys(sample_id=["c0", "cn", "c1"], session_id=["s2"] * 3, created_at=[1000, None, 2000]),
            keys(
                sample_id=["f0", "f1", "f2"],
                session_id=["s3"] * 3,
                source_uri=["file:///a.jsonl", "file:///a.jsonl", "file:///b.jsonl"],
            ),
        ]
    )
    assert previous_of(df) == {
        "t1": (["t0"], None),
        "tn": (None, "no_turn"),
        "c1": (["c0"], None),
        "cn": (None, "no_timestamp"),
        "f1": (["f0"], None),
        "f2": (None, "across_files"),
    }


def test_undetermined_predecessors_are_reported_by_the_check(tmp_path):
    turns = chain(P0, [reply("A."), reply("B.")], [user("Go")])
    rows = [
        row("u0", *turns[0], session_id="s", turn=0),
        row("u1", *turns[1], session_id="s", turn=None, source_line=2),
        row("v0", *turns[0], session_id="v", created_at=None, source_uri="file:///a.jsonl"),
        row("v1", *turns[1], session_id="v", created_at=None, source_uri="file:///b.jsonl"),
    ]
    result, got, full = checked(tmp_path, rows)
    assert got["u1"] == ("note", ["prefix_unordered"], None)
    assert got["v1"] == ("note", ["prefix_unordered"], None)
    assert got["u0"] == ("ok", [], None) and got["v0"] == ("ok", [], None)
    assert result.prefix_undetermined == {"across_files": 1, "no_turn": 1}
    assert result.reasons == {"prefix_unordered": 2}
    assert json.loads(full["u1"]["detail"])["evidence"]["why"] == "no_turn"


# --- agents: one trajectory each -------------------------------------------------------------------------------


def multi_agent_rows(fork: bool) -> list[dict]:
    """A planner and a worker interleaved in one session, all within one second; the worker's third turn
    optionally holds an edited history (FORK), and its fourth extends the edited one."""
    plan = chain(P0, [reply("Step 1."), reply("Step 2."), reply("Step 3.")], [user("Next"), user("Next")])
    work = chain(
        Q0,
        [
            reply("Booked."),
            reply("Paid the deposit by card, the rest is due on arrival."),
            reply("Sent."),
            reply("Done."),
        ],
        [user("Go"), user("Go"), user("Go")],
    )
    if fork:
        edited = work[1][0] + reply("Paid nothing yet: the hotel wants a bank transfer.") + user("Go")
        work[2] = (edited, work[2][1])
        work[3] = (edited + work[2][1] + user("Go"), work[3][1])
    order = [("planner", 0), ("worker", 0), ("worker", 1), ("planner", 1), ("worker", 2), ("planner", 2), ("worker", 3)]
    rows = []
    for line, (agent, i) in enumerate(order, start=1):
        p, c = (plan if agent == "planner" else work)[i]
        rows.append(row(f"{agent}{i}", p, c, session_id="s", agent_id=agent, created_at=SECOND, source_line=line))
    return rows


def test_two_interleaved_agents_are_each_clean(tmp_path):
    result, got, _ = checked(tmp_path, multi_agent_rows(fork=False))
    assert {k: v[2] for k, v in got.items()} == {
        "planner0": None,
        "planner1": "CLEAN",
        "planner2": "CLEAN",
        "worker0": None,
        "worker1": "CLEAN",
        "worker2": "CLEAN",
        "worker3": "CLEAN",
    }
    assert result.prefix == {"CLEAN": 5, "REALIGN": 0, "FORK": 0}


def test_without_agent_ids_the_interleaved_session_forks(tmp_path):
    rows = multi_agent_rows(fork=False)
    for r in rows:
        r["agent_id"] = None
    result, _, _ = checked(tmp_path, rows)
    assert result.prefix["FORK"] > 0


def test_a_fork_in_one_agent_does_not_touch_the_other(tmp_path):
    result, got, _ = checked(tmp_path, multi_agent_rows(fork=True))
    assert got["worker2"] == ("note", ["prefix_fork"], "FORK")
    assert got["worker3"] == ("ok", [], "CLEAN")  # extends the edited history: a new trajectory went on cleanly
    assert [got[f"planner{i}"] for i in range(3)] == [("ok", [], None), ("ok", [], "CLEAN"), ("ok", [], "CLEAN")]
    assert result.prefix == {"CLEAN": 4, "REALIGN": 0, "FORK": 1}


# --- where the agent comes from ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "field", "agent"),
    [
        ({"metadata": {"agent_id": "planner"}}, None, "planner"),
        ({"metadata": {"agent_name": "coder"}}, None, "coder"),
        ({"agent": {"id": "a-7", "name": "x"}}, None, "a-7"),
        ({"agent": {"name": "x"}}, None, "x"),
        ({"agent_ref": {"type": "responses_api_agents", "name": "simple_agent"}}, None, "simple_agent"),
        ({"request": {"body": {"metadata": {"agent_id": 12}}}, "response": {}}, None, "12"),
        ({"request": {"headers": {"X-LiteLLM-Agent-Id": "w1"}, "body": {}}, "response": {}}, None, "w1"),
        ({"request": {"headers": [["x-agent-name", "w2"]]}, "response": {}}, None, "w2"),
        ({"standard_logging_object": {"metadata": {"requester_metadata": {"agent_id": "lit"}}}}, None, "lit"),
        ({"metadata": {"agent_id": "planner", "role": "critic"}}, "role", "critic"),
        ({"metadata": {"agent_id": "planner"}}, "role", None),
        ({"metadata": {"agent_id": True, "agent": ""}}, None, None),
        ([1, 2], None, None),
    ],
)
def test_agent_of(record, field, agent):
    assert agent_of(record, field) == agent


def test_finer_timestamp_of_request_and_response():
    assert finer_time(1767225600000000, 1767225600123000) == 1767225600123000
    assert finer_time(1767225600000000, 1767225600000007) == 1767225600000007
    assert finer_time(1767225600000000, 1767225601000000) == 1767225600000000
    assert finer_time(1767225600456000, 1767225600123000) == 1767225600456000
    assert finer_time(None, 5) == 5 and finer_time(5, None) == 5


def proxy_line(rid: str, agent_header: str | None, agent_meta: str | None, ts: str, prompt: list[int]) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": {"session_id": "s-1"}}
    if agent_meta:
        body["metadata"]["agent"] = agent_meta
    response = {
        "id": rid,
        "object": "chat.completion",
        "created": 1767225600,
        "model": "m",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "token_ids": [51119, 1],
                "logprobs": {
                    "content": [{"token": "token_id:51119", "logprob": -0.5}, {"token": "token_id:1", "logprob": -0.2}]
                },
                "finish_reason": "stop",
            }
        ],
    }
    headers = {"X-Agent-Id": agent_header} if agent_header else {}
    record = {
        "timestamp": ts,
        "request": {"headers": headers, "body": body},
        "response": {"status_code": 200, "body": response},
    }
    return json.dumps(record)


@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 12, 31)))
def test_a_sample_time_keeps_its_microseconds(moment):
    expected = (moment.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    got = {timestamp_us(v) for v in (moment, moment.isoformat() + "Z", moment.replace(tzinfo=UTC).isoformat())}
    assert len(got) == 1
    us = got.pop()
    # exact, but for a time exactly half-way between two milliseconds, kept a microsecond inside the one
    # timestamp_ms rounds to: a sample's inline reward events keep the milliseconds (and the ids) they had
    assert us == expected or (abs(us - expected) == 1 and expected % 1000 == 500)
    assert round(us / 1000) == timestamp_ms(moment)


@given(st.one_of(st.floats(min_value=0, max_value=4e12, allow_nan=False), st.datetimes(max_value=datetime(9999, 1, 1))))
def test_inline_reward_events_keep_the_milliseconds_and_ids_of_the_raw_time(value):
    import pyarrow as pa

    from prl.event_ids import reward_id
    from prl.ingestion.inline_rewards import inline_reward_rows

    us, ms = timestamp_us(value), timestamp_ms(value)
    assert abs(us - ms * 1000) <= 499
    empty = pa.array([], pa.int64())
    sample = Sample("r", 0, empty, empty, pa.array([], pa.float64()), "stop", created_at_us=us, rewards={"ok": 1.0})
    (event,) = inline_reward_rows(sample, "r#0", "file:///a.jsonl", 1, now_ms=0)
    assert (event["created_at"], event["event_id"]) == (ms, reward_id("r#0", "ok", 1.0, ms))


def test_epoch_numbers_keep_their_fraction():
    assert timestamp_us(1767225600) == 1767225600000000  # seconds
    assert timestamp_us(1767225600.250125) == 1767225600250125
    assert timestamp_us(1767225600250) == 1767225600250000  # milliseconds
    assert timestamp_us(1767225600250.25) == 1767225600250250
    assert timestamp_us("2026-01-01T00:00:00.123456789Z") == 1767225600123456  # nanoseconds: to the microsecond
    assert [timestamp_us(v) for v in (True, -1, float("nan"), 2.6e14, "noon", None)] == [None] * 6


def test_ingest_takes_the_agent_and_the_request_time_to_the_microsecond(tmp_path):
    src = tmp_path / "capture.jsonl"
    lines = [
        proxy_line("r1", "planner", None, "2026-01-01T00:00:00.250123Z", [0, 5]),
        proxy_line("r2", None, "worker", "2026-01-01T00:00:00.750Z", [0, 6]),
        proxy_line("r3", None, None, "2026-01-01T00:00:00Z", [0, 7]),
    ]
    src.write_text("\n".join(lines) + "\n")
    store = Store(str(tmp_path / "store"))
    ingest([str(src)], store)
    got = {
        r["request_id"]: (r["agent_id"], r["created_at"].isoformat())
        for r in store.read("traces", columns=["request_id", "agent_id", "created_at"]).to_pylist()
    }
    assert got == {
        "r1": ("planner", "2026-01-01T00:00:00.250123+00:00"),
        "r2": ("worker", "2026-01-01T00:00:00.750000+00:00"),
        "r3": (None, "2026-01-01T00:00:00+00:00"),
    }
    store2 = Store(str(tmp_path / "store2"))
    ingest([str(src)], store2, agent_field="agent")
    agents = sorted(store2.read("traces", columns=["agent_id"]).column("agent_id").to_pylist(), key=str)
    assert agents == [None, None, "worker"]


def test_trajectory_order_for_merging():
    df = pl.concat(
        [
            keys(sample_id=["b2", "a0", "b1", "a1"], agent_id=["b", "a", "b", "a"], turn=[2, 0, 1, 1]),
            keys(sample_id=["solo"], session_id=[None]),
            keys(sample_id=["u0", "un"], session_id=["s2", "s2"], created_at=[1000, None]),
        ]
    )
    out = trajectory_order(df)
    names = df.get_column("sample_id").to_list()
    groups: dict[int, list[str]] = {}
    for r, t in out.iter_rows():
        groups.setdefault(t, []).append(names[r])
    assert sorted(groups.values()) == [["a0", "a1"], ["b1", "b2"], ["solo"], ["u0"], ["un"]]
    assert sorted(out.get_column("row").to_list()) == list(range(df.height))
    assert out.get_column("trajectory").is_sorted()  # a trajectory's rows are consecutive
