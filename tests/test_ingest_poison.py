"""Poison values: a lone surrogate in any string, a setting that is not finite, an integer beyond 2^53, a
boolean where a logprob belongs. Each is quarantined with its own reason (or kept exactly) while the rest of
its file lands, on every road a record may take (the columnar road, ``parse``),
and a value already in a store never stops a build."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from prl.formats import registry
from prl.formats.base import ParseOptions, Quarantined, Sample, decode_json
from prl.formats.guard import read_record
from prl.ingestion.traces import ingest
from prl.shards.build import build_shards
from tests.formats_helpers import FIXTURES
from tests.records import sglang_generate, vllm_chat, vllm_completion
from tests.shards_fixtures import make_store, reward, trace

SURROGATE = "a\udfffb"
"""A lone low surrogate: ``"a\\udfffb"`` is valid JSON text, but no UTF-8 string column can hold it."""
RAW_SURROGATE = b"a\xed\xbf\xbfb"
"""The same surrogate as raw bytes (the standard library's decoder lets them through)."""


def good(i: int) -> dict[str, Any]:
    return vllm_chat(f"good{i}", [1, 2], [([3, 1], [-0.5, -0.25])])


def line(record: Any) -> bytes:
    return json.dumps(record).encode()


def raw_line(record: Any) -> bytes:
    """``record`` as JSON with every surrogate written as its raw (invalid UTF-8) bytes."""
    return json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")


def run(tmp_path: Path, lines: list[bytes], name: str = "in.jsonl") -> tuple[Any, pl.DataFrame, pl.DataFrame]:
    """Ingest ``lines`` into a fresh store: (result, traces, quarantine)."""
    path = tmp_path / "in" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(text + b"\n" for text in lines))
    store = tmp_path / "store"
    result = ingest([str(path)], str(store), max_quarantine_rate=None)
    traces = pl.read_delta(str(store / "traces"))
    quarantine = pl.read_delta(str(store / "quarantine")) if (store / "quarantine").exists() else pl.DataFrame()
    return result, traces, quarantine


def with_token(record: dict[str, Any], token: str, head: bool) -> dict[str, Any]:
    entry = record["choices"][0]["logprobs"]["content"][0]
    if head:
        entry["top_logprobs"] = [{"token": token, "logprob": -0.5}]
    else:
        entry["token"] = token
    return record


# --- 1. lone surrogates ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["escaped", "raw"])
@pytest.mark.parametrize("place", ["token", "head_token"])
def test_a_surrogate_in_a_logprob_token_is_quarantined_and_the_file_lands(tmp_path, spelling, place):
    """Failed once: a block conversion of many records' tokens raised UnicodeEncodeError, the run died with
    nothing committed, and every rerun died the same way."""
    bad = with_token(good(1), SURROGATE, head=place == "head_token")
    lines = [line(good(0)), line(bad) if spelling == "escaped" else raw_line(bad), line(good(2))]
    result, traces, quarantine = run(tmp_path, lines)
    assert (result.samples, result.quarantined, result.files[0].status) == (2, {"bad_string": 1}, "ingested")
    assert sorted(traces["sample_id"].to_list()) == ["good0#0", "good2#0"]
    assert quarantine.select("source_line", "reason").rows() == [(2, "bad_string")]


def test_the_raw_bytes_of_a_quarantined_line_are_kept_escaped(tmp_path):
    """``quarantine.raw`` is a string column: bytes that are not UTF-8 are written ``\\xNN``, not replaced."""
    bad = raw_line(with_token(good(1), SURROGATE, head=False))
    _, _, quarantine = run(tmp_path, [line(good(0)), bad])
    (raw,) = quarantine["raw"].to_list()
    assert "a\\xed\\xbf\\xbfb" in raw
    assert raw.encode().replace(b"\\xed\\xbf\\xbf", b"\xed\xbf\xbf") == bad


def test_many_surrogate_records_in_one_block_leave_the_good_ones(tmp_path):
    """A block of records where every other token is poisoned: the good rows are still read together."""
    lines = []
    for i in range(200):
        record = good(i)
        lines.append(line(with_token(record, SURROGATE, head=False)) if i % 2 else line(record))
    result, traces, _ = run(tmp_path, lines)
    assert (result.samples, result.quarantined) == (100, {"bad_string": 100})
    assert traces.height == 100


@pytest.mark.parametrize("spelling", ["escaped", "raw"])
def test_a_surrogate_on_the_columnar_road_is_quarantined(tmp_path, spelling):
    """Chat completions of the common shape go through Arrow's JSON reader: it refuses an escaped lone
    surrogate and the road refuses invalid UTF-8, so the record is read by ``parse`` and quarantined."""
    records = [good(i) for i in range(64)]
    records[10]["choices"][0]["message"]["content"] = SURROGATE
    records[20]["model"] = SURROGATE
    encode = line if spelling == "escaped" else raw_line
    result, _traces, quarantine = run(tmp_path, [encode(r) for r in records])
    assert (result.samples, result.quarantined) == (62, {"bad_string": 2})
    assert quarantine.sort("source_line").select("source_line", "reason").rows() == [
        (11, "bad_string"),
        (21, "bad_string"),
    ]


def test_a_surrogate_agent_is_quarantined(tmp_path):
    """Failed before: the agent is read after the scalar checks, and its batch failed to assemble."""
    record = good(1) | {"metadata": {"agent_id": SURROGATE}}
    result, _traces, quarantine = run(tmp_path, [line(good(0)), line(record)])
    assert (result.samples, result.quarantined) == (1, {"bad_string": 1})
    assert quarantine["message"].to_list() == ["agent_id holds a lone UTF-16 surrogate: not valid Unicode"]


def _string_paths(obj: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(obj, str):
        return [path]
    if isinstance(obj, dict):
        return [p for key, value in obj.items() for p in _string_paths(value, (*path, key))]
    if isinstance(obj, list):
        return [p for i, value in enumerate(obj[:3]) for p in _string_paths(value, (*path, i))]
    return []


def _set(obj: Any, path: tuple, value: Any) -> Any:
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return obj


SEED_FILES = sorted(p for p in FIXTURES.rglob("*.jsonl"))


@pytest.mark.parametrize("fixture", SEED_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_surrogate_in_any_string_of_any_format_lands_the_rest(tmp_path, fixture):
    """Every string of every recorded fixture record replaced by a lone surrogate, one record per line, after
    the fixture's own lines: every line ends as samples or quarantine rows (or repeats a kept sample), never a
    crash."""
    seeds = [json.loads(text) for text in fixture.read_bytes().splitlines() if text.strip()]
    poisoned = [_set(copy.deepcopy(seed), path, SURROGATE) for seed in seeds for path in _string_paths(seed)]
    lines = [line(seed) for seed in seeds] + [line(p) for p in poisoned] + [raw_line(p) for p in poisoned]
    result, traces, quarantine = run(tmp_path, lines, fixture.name)
    assert result.files[0].status == "ingested"
    assert result.records == len(lines)
    assert "parse_error" not in result.quarantined
    kept = set(traces["source_line"].to_list()) if traces.height else set()
    # a line neither kept nor quarantined repeats a sample already kept (its surrogate was in a field not read)
    unaccounted = set(range(1, len(lines) + 1)) - kept - set(quarantine["source_line"].to_list())
    assert len(unaccounted) <= result.already_present


# --- 2. sampling settings that are not finite ------------------------------------------------------------

PROXY = json.loads((FIXTURES / "envelopes" / "proxy_capture.jsonl").read_bytes().splitlines()[0])


@pytest.mark.parametrize(
    ("setting", "text"),
    [("temperature", b"Infinity"), ("temperature", b"1e400"), ("top_p", b"NaN"), ("top_p", b"-Infinity")],
)
def test_a_nonfinite_sampling_setting_is_quarantined(tmp_path, setting, text):
    """Failed before: the setting was stored as inf / NaN (and a build then failed writing its manifest)."""
    bad = copy.deepcopy(PROXY)
    bad["request"]["body"][setting] = "POISON"
    bad_line = line(bad).replace(b'"POISON"', text)
    other = copy.deepcopy(PROXY)
    other["response"]["body"]["id"] = "chatcmpl-p2"
    result, traces, quarantine = run(tmp_path, [bad_line, line(other)])
    assert (result.samples, result.quarantined) == (1, {"nonfinite_setting": 1})
    assert traces.select("sample_id", "temperature", "top_p").rows() == [
        ("chatcmpl-p2#0", 0.699999988079071, 0.949999988079071)
    ]
    assert quarantine["message"].to_list()[0].startswith(f"{setting} ")


def test_a_build_over_nonfinite_settings_in_the_store_publishes(tmp_path):
    """A store written otherwise than by ingest may hold them: the build publishes, the manifest names them.
    Failed before: ``ValueError: Out of range float values are not JSON compliant`` writing manifest.json, and
    a policy version whose number is beyond int64 stopped the plan (``InvalidOperationError``)."""
    traces = [
        trace("a0:0", "ga", [1, 2], [10, 11], temperature=math.inf),
        trace("a1:0", "ga", [1, 2], [12], top_p=math.nan),
        trace("b0:0", "gb", [3], [20], temperature=-math.inf),
        trace("c0:0", "gc", [4], [21], policy_version=f"step-{BIG}"),  # a step beyond int64: unknown
    ]
    store = make_store(str(tmp_path / "store"), traces, [reward(t["sample_id"], 1.0) for t in traces])
    result = build_shards(store, str(tmp_path / "out"))
    assert (result.status, result.rows) == ("built", 4)
    manifest = json.loads(Path(result.manifest_path).read_text())
    values = manifest["sampling"]["temperature"]["values"]
    assert sorted(v["value"] for v in values if isinstance(v["value"], str)) == ["-inf", "inf"]
    assert {v["value"]: v["rows"] for v in manifest["sampling"]["top_p"]["values"]} == {1.0: 3, "nan": 1}
    assert manifest["sampling"]["policy"] == {
        "versions": 2,
        "unknown_version": 0,
        "min_step": 10,
        "max_step": 10,
        "rows_with_spans": 0,
    }


def test_json_safe_names_every_nonfinite_float():
    from prl.shards.publish import json_safe

    value = {"a": [1.0, math.inf, {"b": -math.inf}], "c": (math.nan, 2), "d": "inf"}
    assert json_safe(value) == {"a": [1.0, "inf", {"b": "-inf"}], "c": ["nan", 2], "d": "inf"}


# --- 6. integers beyond 2^53, booleans as logprobs --------------------------------------------------------

BIG = 2**70


def test_integer_session_and_agent_ids_are_kept_exactly(tmp_path):
    """Failed before: orjson reads an integer beyond 64 bits as a float, so 2^70 and 2^70 + 1 both became
    ``'1.1805916207174113e+21'`` (two sessions merged) and an agent of 2^70 was lost."""
    first = good(0) | {"session_id": BIG, "metadata": {"agent_id": BIG}}
    second = good(1) | {"session_id": BIG + 1, "metadata": {"agent_id": BIG + 1}}
    _, traces, _ = run(tmp_path, [line(first), line(second)])
    assert traces.sort("sample_id").select("session_id", "agent_id").rows() == [
        (str(BIG), str(BIG)),
        (str(BIG + 1), str(BIG + 1)),
    ]


@pytest.mark.parametrize("text", [b"-9223372036854775809", b"18446744073709551616", b"99999999999999999999999"])
def test_decode_json_keeps_integers_beyond_64_bits(text):
    decoded = decode_json(b'{"a": [1.5, ' + text + b"]}")["a"]
    assert (decoded, type(decoded[1])) == ([1.5, int(text)], int)  # an int: a float may compare equal


def test_decode_json_takes_the_fast_decoder_for_long_fractions_and_nanosecond_times():
    from prl.formats.base import may_hold_big_integer

    assert not may_hold_big_integer(b'{"lp": -0.00012345678901234567891, "t": 1767225600000000000}')
    assert may_hold_big_integer(b'{"s": 1180591620717411303424}')


def _chat_head(value: Any) -> dict[str, Any]:
    record = vllm_chat(
        "h", [1, 2], [([3, 1], [-0.5, -0.25])], heads=[[[(3, -0.5), (4, -1.5)], [(1, -0.25), (5, -2.5)]]]
    )
    record["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["logprob"] = value
    return record


def _completion_head(value: Any) -> dict[str, Any]:
    return vllm_completion(
        "c",
        [1, 2],
        [3, 1],
        [-0.5, -0.25],
        heads=[{"token_id:3": -0.5, "token_id:4": value}, {"token_id:1": -0.25, "token_id:5": -2.5}],
    )


def _generate_head(value: Any) -> dict[str, Any]:
    record = json.loads((FIXTURES / "vllm_generate" / "generate.jsonl").read_bytes().splitlines()[0])
    record["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["logprob"] = value
    return record


def _batch_head(value: Any) -> dict[str, Any]:
    record = json.loads((FIXTURES / "envelopes" / "openai_batch.jsonl").read_bytes().splitlines()[0])
    entry = record["response"]["body"]["choices"][0]["logprobs"]["content"][0]
    entry["top_logprobs"] = [{"token": "token_id:51119", "logprob": -0.5}, {"token": "token_id:7", "logprob": value}]
    record["response"]["body"]["choices"][0]["logprobs"]["content"][1]["top_logprobs"] = [
        {"token": "token_id:1", "logprob": -0.25},
        {"token": "token_id:8", "logprob": -3.0},
    ]
    return record


def _proxy_head(value: Any) -> dict[str, Any]:
    record = copy.deepcopy(PROXY)
    content = record["response"]["body"]["choices"][0]["logprobs"]["content"]
    content[0]["top_logprobs"] = [
        {"token": "token_id:51119", "logprob": -0.5},
        {"token": "token_id:7", "logprob": value},
    ]
    content[1]["top_logprobs"] = [{"token": "token_id:1", "logprob": -0.25}, {"token": "token_id:8", "logprob": -3.0}]
    return record


def _tgi_head(value: Any) -> dict[str, Any]:
    record = json.loads((FIXTURES / "tgi" / "tgi.jsonl").read_bytes().splitlines()[0])
    record["details"]["top_tokens"][0][1]["logprob"] = value
    return record


HEADS = {
    "openai_chat": _chat_head,
    "openai_completions": _completion_head,
    "vllm_generate": _generate_head,
    "openai_batch": _batch_head,
    "proxy_capture": _proxy_head,
    "tgi": _tgi_head,
}


def _read(record: Any) -> list[Sample | Quarantined]:
    obj = decode_json(line(record))
    return read_record(registry.PerRecord(None), obj, ParseOptions(), "k:1")[1]


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_head_logprob_is_quarantined(name, value):
    """Failed before: Arrow read ``true`` / ``false`` beside numbers as 1.0 / 0.0, stored as a head logprob."""
    assert isinstance(_read(HEADS[name](-4.0))[0], Sample)  # the record is fine with a number there
    item = _read(HEADS[name](value))[0]  # choice 0 holds the head (a TGI record has a best-of sequence too)
    assert isinstance(item, Quarantined)
    assert (item.reason, item.choice_index, "booleans" in item.message) == ("bad_logprob", 0, True)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_boolean_head_logprob_is_quarantined_through_ingest(tmp_path, name):
    result, _, quarantine = run(tmp_path, [line(HEADS[name](False))])
    assert result.samples == 0
    assert quarantine.sort("reason").select("reason", "message").rows()[0][0] == "bad_logprob"
    assert "holds booleans" in quarantine.filter(pl.col("reason") == "bad_logprob")["message"][0]


# --- 7. reader bugs that were parse_error -----------------------------------------------------------------


@pytest.mark.parametrize("entry", [None, 5, -0.5, "x", {"a": 1}])
@pytest.mark.parametrize("where", ["output_token_logprobs", "output_top_logprobs"])
def test_sglang_triples_that_are_not_lists_are_bad_shape(entry, where):
    """Failed before: ``TypeError: 'NoneType' object is not iterable`` (``zip`` over the entries): parse_error."""
    heads = [[(-0.5, 3), (-1.0, 9)], [(-0.25, 4), (-2.0, 9)], [(-0.5, 5), (-2.0, 9)]]
    record = sglang_generate("s", [1, 2], [3, 4, 5], [-0.5, -0.25, -0.5], heads=heads)
    # the middle entry: the first and the last were checked before
    record["meta_info"][where][1] = entry if where == "output_token_logprobs" or entry is not None else 7
    (item,) = _read(record)
    assert isinstance(item, Quarantined)
    assert item.reason == "bad_shape"


@pytest.mark.parametrize("text", [[], ["<pad>"], {"a": 1}, 5])
def test_tgi_prefill_text_that_is_not_a_string_is_no_decoder_start(text):
    """Failed before: ``TypeError: unhashable type: 'list'`` looking the text up among decoder start tokens."""
    record = json.loads((FIXTURES / "tgi" / "t5_seq2seq.jsonl").read_bytes().splitlines()[0])
    record["details"]["prefill"][0]["text"] = text
    (item,) = _read(record)
    assert isinstance(item, Sample)  # the text is not read: the one prefill ID is the prompt
    assert item.prompt_token_ids.to_pylist() == [0]


@pytest.mark.parametrize("fixture", ["verl", "slime"])
@pytest.mark.parametrize("value", [2**63 - 1, -(2**63 - 1), 2**53 + 1])
def test_an_integer_logprob_beyond_2_53_is_bad_logprob(fixture, value):
    """Failed before: ``ArrowInvalid: Integer value ... not in range`` casting to float64: parse_error."""
    record = json.loads((FIXTURES / "rollouts" / f"{fixture}.jsonl").read_bytes().splitlines()[0])
    key = "response_logprobs" if fixture == "verl" else "rollout_log_probs"
    record[key] = [value] + [-1] * (len(record[key]) - 1)  # integers only: Arrow reads them as int64
    (item,) = _read(record)
    assert isinstance(item, Quarantined)
    assert (item.reason, "beyond 2^53" in item.message) == ("bad_logprob", True)


def test_a_session_id_of_zero_is_kept_and_false_names_none():
    """Failed before: ``session_id`` 0 was read as absent (``or``), ``false`` became the text ``'False'``."""
    base = json.loads((FIXTURES / "rollouts" / "slime.jsonl").read_bytes().splitlines()[0])
    sessions = []
    for value in (0, False, BIG):
        record = copy.deepcopy(base)
        record["metadata"]["session_id"] = value
        (item,) = _read(record)
        sessions.append(item.session_id)
    assert sessions == ["0", None, str(BIG)]


PRIME = json.loads((FIXTURES / "rollouts" / "prime_rl.jsonl").read_bytes().splitlines()[0])


def test_a_boolean_reward_weight_is_no_number(tmp_path):
    """Failed before: a prime-rl reward ``weight`` of ``true`` counted as 1.0."""
    record = copy.deepcopy(PRIME)
    record["traces"][0]["rewards"]["correct"]["weight"] = True
    result, traces, quarantine = run(tmp_path, [line(record)])
    assert result.samples == traces.height > 0
    assert quarantine.select("table", "reason").rows() == [("rewards", "bad_value")]


def test_a_surrogate_reward_name_quarantines_the_reward_and_keeps_the_sample(tmp_path):
    """Failed before: the rewards batch failed to build (UnicodeEncodeError) and the run died."""
    record = copy.deepcopy(PRIME)
    rewards = record["traces"][0]["rewards"]
    rewards[SURROGATE] = rewards.pop("correct")
    result, traces, quarantine = run(tmp_path, [line(record)])
    assert result.samples == traces.height > 0
    assert quarantine.select("table", "reason").rows() == [("rewards", "bad_string")]


def test_a_surrogate_stream_id_is_quarantined_and_the_capture_lands(tmp_path):
    """Failed before: the SSE framer encoded the chunk ``id`` to compare it with the line, and a lone
    surrogate there raised UnicodeEncodeError out of ingest (found by the fuzz campaign)."""
    streams = (FIXTURES / "sse" / "streams.sse").read_bytes()
    bad = streams.replace(b'"id": "chatcmpl-s1"', b'"id": "\xed\xa0\x80"')  # raw bytes of a lone surrogate
    assert bad != streams
    path = tmp_path / "in" / "capture.sse"
    path.parent.mkdir(parents=True)
    path.write_bytes(bad)
    result = ingest([str(path)], str(tmp_path / "store"), max_quarantine_rate=None, partial_line_grace=0)
    clean = ingest(
        [str(FIXTURES / "sse" / "streams.sse")], str(tmp_path / "clean"), max_quarantine_rate=None, partial_line_grace=0
    )
    assert result.files[0].status == "ingested"
    assert result.quarantined.get("bad_string", 0) >= 1
    assert result.samples == clean.samples - 1


@pytest.mark.parametrize("versions", [[[1], [2]], [1, [2]], [None, "1"], [1.5, 2.5]])
def test_sglang_weight_versions_that_are_not_versions_are_bad_shape(versions):
    """Failed before: numpy raised ValueError on an inhomogeneous list (parse_error; found by the campaign)."""
    record = sglang_generate("s", [1, 2], [3, 4], [-0.5, -0.25], weight_versions=versions)
    (item,) = _read(record)
    assert isinstance(item, Quarantined)
    assert (item.reason, item.message) == (
        "bad_shape",
        "weight_versions entries are not versions (strings or integers)",
    )
