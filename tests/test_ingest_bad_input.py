"""Every bad input: quarantined with its reason (or a clear error), good records in the same file still land."""

from __future__ import annotations

import copy
import gzip
import json
from typing import Any

import numpy as np
import polars as pl
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prl.errors import ExitCode, UsageError
from prl.formats import registry
from prl.ingestion.traces import RAW_KEEP, ingest
from prl.schema import RAW_LIMIT
from tests.records import sglang_generate, vllm_chat

GOOD = vllm_chat("good", [1, 2], [([3, 1], [-0.5, -0.25])])


def reasons(store) -> list[tuple[int, str]]:
    df = pl.read_delta(store.table_uri("quarantine")).sort("source_line", "reason")
    return list(zip(df["source_line"].to_list(), df["reason"].to_list()))


def sample_ids(store) -> list[str]:
    return sorted(pl.read_delta(store.table_uri("traces"))["sample_id"].to_list())


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ('{"id": "x", "object": "chat.completion", "choices": [', "malformed_json"),
        (vllm_chat("len", [1], [([2, 3], [-1.0])]), "length_mismatch"),
        (vllm_chat("nan", [1], [([2, 3], [-1.0, float("nan")])]), "nonfinite_logprob"),
        (vllm_chat("inf", [1], [([2], [float("-inf")])]), "nonfinite_logprob"),
        (vllm_chat("pos", [1], [([2, 3], [-1.0, 0.5])]), "positive_logprob"),
        (vllm_chat("neg", [1, -4], [([2], [-1.0])]), "bad_token_id"),
        (vllm_chat("big", [1], [([2**31], [-1.0])]), "bad_token_id"),
        ({**vllm_chat("flt", [1], [([2], [-1.0])]), "prompt_token_ids": [1.5]}, "bad_token_id"),
        ({**vllm_chat("str", [1], [([2], [-1.0])]), "prompt_token_ids": "1 2 3"}, "bad_token_id"),
        (vllm_chat("fin", [1], [([2], [-1.0])], finish_reason="weird"), "bad_finish_reason"),
        (vllm_chat("emp", [1], [([], [])]), "empty_completion"),
        (vllm_chat("nop", [], [([2], [-1.0])]), "no_prompt_ids"),
        ({**vllm_chat("noid", [1], [([2], [-1.0])]), "prompt_token_ids": None}, "no_token_ids"),
        (
            {
                "id": "t",
                "object": "chat.completion",
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            },
            "no_token_ids",
        ),
        (
            vllm_chat("txt", [1], [([2], [-1.0])], with_token_ids=False)
            | {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "logprobs": {"content": [{"token": "Hello", "logprob": -1.0, "top_logprobs": []}]},
                    }
                ]
            },
            "no_token_ids",
        ),
        (
            {
                **vllm_chat("lpstr", [1], [([2], [-1.0])]),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "token_ids": [2],
                        "logprobs": {"content": [{"token": "token_id:2", "logprob": "high"}]},
                    }
                ],
            },
            "bad_logprob",
        ),
        (
            {
                **vllm_chat("nolp", [1], [([2], [-1.0])]),
                "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [2], "logprobs": None}],
            },
            "no_logprobs",
        ),
        (
            {
                **vllm_chat("mism", [1], [([2], [-1.0])]),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "token_ids": [5],
                        "logprobs": {"content": [{"token": "token_id:2", "logprob": -1.0}]},
                    }
                ],
            },
            "token_mismatch",
        ),
        ({"id": 5, "object": "chat.completion", "prompt_token_ids": [1], "choices": []}, "missing_request_id"),
        ({"id": "e", "object": "chat.completion", "prompt_token_ids": [1], "choices": []}, "no_choices"),
        ({"id": "w", "object": "chat.completion", "prompt_token_ids": [1], "choices": "oops"}, "bad_shape"),
    ],
)
def test_bad_record_is_quarantined_good_one_lands(store, write_trace, bad, reason):
    path = write_trace("mixed.jsonl", [GOOD, bad, GOOD | {"id": "good2"}])
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert result.quarantined == {reason: 1}
    assert result.samples == 2
    assert sample_ids(store) == ["good#0", "good2#0"]
    assert reasons(store) == [(2, reason)]
    row = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert row["raw"].startswith(bad if isinstance(bad, str) else "{")
    assert row["source_uri"] == str(path)


def test_one_bad_choice_keeps_the_others(store, write_trace):
    record = vllm_chat("multi", [1], [([2], [-1.0]), ([3], [float("nan")]), ([4], [-2.0])])
    result = ingest([str(write_trace("m.jsonl", [record]))], store)
    assert sample_ids(store) == ["multi#0", "multi#2"]
    q = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert (q["reason"], q["sample_id"]) == ("nonfinite_logprob", "multi#1")
    assert result.exit_code == ExitCode.DATA_PROBLEMS  # 1 of 3 > 5%


def test_duplicate_request_id_with_other_content(store, write_trace):
    same = vllm_chat("dup", [1], [([2], [-1.0])])
    other = vllm_chat("dup", [1], [([2], [-2.0])])
    result = ingest([str(write_trace("dup.jsonl", [same, same, other]))], store, max_quarantine_rate=None)
    assert (result.samples, result.already_present, result.quarantined) == (1, 1, {"duplicate_sample_id": 1})
    assert reasons(store) == [(3, "duplicate_sample_id")]


def test_a_long_duplicate_shows_the_start_of_its_raw_text(store, write_trace):
    """Kept records hold only the first RAW_KEEP bytes of their raw text until their batch is written: a
    duplicate found then still shows its first RAW_LIMIT characters, marked truncated."""
    tokens = list(range(3, 6003))  # a record of about 60 KB
    same = vllm_chat("long", [1], [(tokens, [-1.0] * len(tokens))])
    other = vllm_chat("long", [1], [(tokens, [-2.0] * len(tokens))])
    path = write_trace("long.jsonl", [same, other])
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.quarantined) == (1, {"duplicate_sample_id": 1})
    q = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    second_line = path.read_bytes().split(b"\n")[1].decode()
    assert len(second_line) > RAW_KEEP
    assert (q["source_line"], q["raw_truncated"], q["raw"]) == (2, True, second_line[:RAW_LIMIT])


def test_truncated_gzip_keeps_decoded_records(store, tmp_path):
    data = gzip.compress(b"".join(json.dumps(GOOD | {"id": f"g{i}"}).encode() + b"\n" for i in range(50)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) - 40])
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert result.quarantined.get("truncated_input") == 1
    assert 0 < result.samples < 50
    # every decoded line is accounted for; the cut-off last line is quarantined, not dropped
    assert result.samples + result.quarantined.get("truncated_line", 0) == result.records


def test_truncated_zstd(store, tmp_path):
    data = zstandard.ZstdCompressor().compress(
        b"".join(json.dumps(GOOD | {"id": f"z{i}"}).encode() + b"\n" for i in range(50))
    )
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(data[: len(data) // 2])
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert result.quarantined.get("truncated_input") == 1
    row = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert "zstd stream ends before its end marker" in row["message"]


def test_corrupt_gzip(store, tmp_path):
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 30)
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert result.quarantined == {"truncated_input": 1}
    assert result.files[0].status == "ingested"  # the damage is recorded; the file is not retried forever
    row = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert row["message"].startswith("gzip stream")


def test_unterminated_last_line(store, tmp_path):
    path = tmp_path / "partial.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"id": "half", "object": "chat.com')
    result = ingest([str(path)], store, max_quarantine_rate=None, partial_line_grace=0)  # no longer written
    assert result.quarantined == {"truncated_line": 1}


def test_empty_and_blank_files(store, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n\n  \n")
    result = ingest([str(empty), str(blank)], store)
    assert result.exit_code == ExitCode.OK  # nothing to read is not an error (a logger may have just opened it)
    assert [(f.status, f.records) for f in result.files] == [("empty", 0), ("empty", 0)]
    assert ingest([str(empty), str(blank)], store).files[0].status == "unchanged"
    blank.write_text(json.dumps(GOOD) + "\n")  # it grows: read again
    assert ingest([str(blank)], store).samples == 1


def test_missing_source_is_usage_error(store, tmp_path):
    with pytest.raises(UsageError, match="no input files match"):
        ingest([str(tmp_path / "nope" / "*.jsonl")], store)


def test_sglang_bad_triples(store, write_trace):
    bad = sglang_generate("s", [1], [2], [-1.0])
    bad["meta_info"]["output_token_logprobs"] = [[-1.0]]
    result = ingest(
        [str(write_trace("s.jsonl", [sglang_generate("ok", [1], [2], [-1.0]), bad]))], store, max_quarantine_rate=None
    )
    assert result.quarantined == {"bad_shape": 1}


printable_lines = st.one_of(
    st.binary(max_size=200).filter(lambda b: b"\n" not in b and b"\r" not in b),
    st.text(max_size=200).filter(lambda s: "\n" not in s and "\r" not in s).map(str.encode),
    st.builds(lambda s: json.dumps(GOOD)[:s].encode(), st.integers(0, 400)),
    st.builds(
        lambda k, v: json.dumps({**GOOD, k: v}).encode(),
        st.sampled_from(["id", "choices", "prompt_token_ids", "object", "created"]),
        st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(-3, 5), max_size=3)),
    ),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(printable_lines, max_size=8))
def test_garbage_never_crashes_never_loses_a_good_line(tmp_path_factory, garbage):
    tmp = tmp_path_factory.mktemp("fuzz")
    from prl.store.tables import Store

    store = Store(str(tmp / "store"))
    lines = [json.dumps(GOOD).encode(), *garbage, json.dumps(GOOD | {"id": "last"}).encode()]
    path = tmp / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = ingest([str(path)], store, max_quarantine_rate=None)
    ids = sample_ids(store)
    assert "good#0" in ids and "last#0" in ids
    # every non-blank line is accounted for: a sample, already present, or quarantined
    nonblank = sum(1 for line in lines if line.strip())
    assert result.records == nonblank


def test_missing_finish_reason_quarantined_unless_given(store, write_trace):
    record = vllm_chat("nofin", [1], [([2], [-1.0])])
    record["choices"][0]["finish_reason"] = None
    path = write_trace("nofin.jsonl", [record])
    result = ingest([str(path)], store, max_quarantine_rate=None, dry_run=True)
    assert result.quarantined == {"missing_finish_reason": 1}
    result = ingest([str(path)], store, finish_reason="length")
    assert result.samples == 1
    assert pl.read_delta(store.table_uri("traces"))["finish_reason"].to_list() == ["length"]
    with pytest.raises(UsageError, match="--finish-reason must be one of"):
        ingest([str(path)], store, finish_reason="done")


def test_completions_heads_that_are_not_objects(store, write_trace):
    from tests.records import vllm_completion

    record = vllm_completion("h", [1], [2], [-1.0], heads=[{"token_id:2": -1.0}])
    record["choices"][0]["logprobs"]["top_logprobs"] = [[None]]
    result = ingest([str(write_trace("h.jsonl", [record]))], store, max_quarantine_rate=None)
    assert result.quarantined == {"bad_logprob": 1}


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan")])
def test_quarantine_rate_must_be_a_fraction(store, write_trace, rate):
    path = write_trace("ok.jsonl", [GOOD])
    with pytest.raises(UsageError, match=r"^--max-quarantine-rate: expected a number in \[0, 1\], got "):
        ingest([str(path)], store, max_quarantine_rate=rate)
    assert store.version("traces") is None


# --- poison records: one record never blocks its file ----------------------------------------------------

GOOD_TEXT = json.dumps(GOOD)


def _poison(old: str, new: str) -> str:
    assert old in GOOD_TEXT
    return GOOD_TEXT.replace(old, new, 1).replace('"id": "good"', '"id": "poison"', 1)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (_poison('"choices": [', '"deep": ' + "[" * 1500 + "]" * 1500 + ', "choices": ['), "too_deep"),
        ("[" * 100_000 + "]" * 100_000, "too_deep"),
        (_poison('"index": 0', f'"index": {2**70}'), "out_of_range"),
        (_poison('"index": 0', f'"index": {2**63}'), "out_of_range"),
        (_poison('"created": 1764460800', f'"turn": {2**40}'), "out_of_range"),
        (_poison('"prompt_token_ids": [1, 2]', f'"prompt_token_ids": [1, {2**64 - 1}]'), "bad_token_id"),
        (_poison('"prompt_token_ids": [1, 2]', f'"prompt_token_ids": [1, {2**70}]'), "bad_token_id"),
        (_poison('"deepseek-v4"', '"\\ud83d"'), "bad_string"),
        (_poison('"id": "good"', '"id": "\\udc00x"'), "bad_string"),
        (_poison('"content": "text"', '"content": "\\ud83d"'), "bad_string"),
        (_poison('"logprob": -0.5', '"logprob": false'), "bad_logprob"),
        (_poison('"logprob": -0.5', '"logprob": true'), "bad_logprob"),
        (_poison('"logprob": -0.5', '"logprob": -1e300'), "out_of_range"),  # finite, but -inf in float32
    ],
)
def test_poison_record_is_quarantined_and_the_file_lands(store, tmp_path, line, reason):
    path = tmp_path / "poison.jsonl"
    path.write_text("\n".join([GOOD_TEXT, line, json.dumps(GOOD | {"id": "good2"})]) + "\n")
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.quarantined) == (2, {reason: 1})
    assert sample_ids(store) == ["good#0", "good2#0"]
    assert reasons(store) == [(2, reason)]
    assert ingest([str(path)], store).files[0].status == "unchanged"  # consumed, not retried forever


def test_logprob_false_in_a_completions_list_is_bad_logprob(store, write_trace):
    from tests.records import vllm_completion

    record = vllm_completion("f", [1], [2, 3], [-1.0, -0.5])
    record["choices"][0]["logprobs"]["token_logprobs"] = [-1.0, False]
    result = ingest([str(write_trace("f.jsonl", [record]))], store, max_quarantine_rate=None)
    assert result.quarantined == {"bad_logprob": 1}


def test_only_the_vllm_floor_becomes_null(store, write_trace):
    record = vllm_chat("floor", [1], [([2, 3, 4], [-9999.0, -10000.0, -1e30])])
    ingest([str(write_trace("floor.jsonl", [record]))], store)
    (logprobs,) = pl.read_delta(store.table_uri("traces"))["completion_logprobs"].to_list()
    assert logprobs == [None, -10000.0, pytest.approx(-1e30, rel=1e-6)]


def test_a_line_over_the_record_limit_is_quarantined(store, tmp_path, monkeypatch):
    from prl.formats import base

    monkeypatch.setattr(base, "MAX_RECORD_BYTES", 4096)
    tokens = list(range(3, 1003))
    huge = json.dumps(vllm_chat("huge", [1], [(tokens, [-1.0] * len(tokens))]))
    assert len(huge) > 4096
    path = tmp_path / "huge.jsonl"
    path.write_text("\n".join([GOOD_TEXT, huge, json.dumps(GOOD | {"id": "good2"})]) + "\n")
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.quarantined) == (2, {"line_too_long": 1})
    row = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert (row["source_line"], row["raw_truncated"], row["raw"]) == (2, True, huge[:RAW_LIMIT])
    assert f"{len(huge)} bytes, over the 4096-byte record limit" in row["message"]


POISON_VALUES = st.sampled_from(
    [
        "__DEEP__",
        2**63,
        2**64,
        2**70,
        -(2**70),
        "\ud83d",
        "\udc00",
        False,
        True,
        -9999.0,
        -1e300,
        1e300,
        "token_id:99999999999999999999",
        [],
        {},
        None,
    ]
)


def _fuzzed_line(record: Any, data: st.DataObject) -> bytes:
    """A fixture record with up to three values replaced by poison, as one JSON line (``__DEEP__`` becomes a
    nesting 2000 levels deep, which no JSON library writes)."""
    from tests.formats_helpers import json_paths

    record = copy.deepcopy(record)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in json_paths(record) if p]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = record
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = data.draw(POISON_VALUES)
    text = json.dumps(record)  # surrogates come out as \\uXXXX escapes, as Python-written JSONL has them
    return text.replace('"__DEEP__"', "[" * 2000 + "]" * 2000).encode()


def _fixture_records() -> list[Any]:
    from tests.formats_helpers import FIXTURES

    records = []
    for path in sorted(FIXTURES.glob("*/*.jsonl")):
        records.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return records


FIXTURE_RECORDS = _fixture_records()


def _decoded(line: bytes) -> Any:
    try:
        return json.loads(line)
    except RecursionError:
        return None


@pytest.mark.slow
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzzed_real_records_never_crash_ingest(tmp_path_factory, data):
    """Fixture records of every format with poison values, through the whole ingest: it never raises, and
    every line ends as a row of traces or quarantine, or is counted as a repeat of a sample already read."""
    from prl.store.tables import Store

    tmp = tmp_path_factory.mktemp("poison")
    count = data.draw(st.integers(1, 6))
    lines = [_fuzzed_line(data.draw(st.sampled_from(FIXTURE_RECORDS)), data) for _ in range(count)]
    path = tmp / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    store = Store(str(tmp / "store"))
    result = ingest([str(path)], store, max_quarantine_rate=None)
    if result.files[0].status == "failed":  # no line is of any known format: not a trace file, said so
        assert "no known format matches" in (result.files[0].error or "")
        assert all(registry.detect_record(_decoded(line)) is None for line in lines)
        return
    assert result.records == len(lines)
    landed = set()
    if store.version("traces") is not None:
        landed |= set(pl.read_delta(store.table_uri("traces"))["source_line"].to_list())
    if store.version("quarantine") is not None:
        landed |= set(pl.read_delta(store.table_uri("quarantine"))["source_line"].to_list())
    unaccounted = [number for number in range(1, len(lines) + 1) if number not in landed]
    assert len(unaccounted) <= result.already_present  # a repeat of an earlier sample adds nothing, and says so


def test_a_record_with_no_sample_in_it_is_quarantined(store, tmp_path):
    """A vLLM RequestOutput whose ``outputs`` list is empty holds no sample: it becomes a quarantine row
    (``no_choices``), never a line that lands nowhere (found by the fuzz test below)."""
    record = {"request_id": "r-empty", "prompt_token_ids": [1, 2, 3], "outputs": [], "finished": True}
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps(record) + "\n")
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert result.samples == 0
    assert result.quarantined == {"no_choices": 1}
    rows = pl.read_delta(store.table_uri("quarantine"))
    assert rows["reason"].to_list() == ["no_choices"]
    assert rows["source_line"].to_list() == [1]


def test_a_head_logprob_beyond_float32_is_out_of_range(store, write_trace):
    heads = [[[(3, -0.5), (4, -1e300)], [(1, -0.25), (5, -2.0)]]]
    bad = vllm_chat("h", [1, 2], [([3, 1], [-0.5, -0.25])], heads=heads)
    good = vllm_chat("g", [1, 2], [([3, 1], [-0.5, -0.25])], heads=[[[(3, -0.5), (4, -3e38)], [(1, -0.25)]]])
    result = ingest([str(write_trace("h.jsonl", [bad, good]))], store, max_quarantine_rate=None)
    assert (result.samples, result.quarantined) == (1, {"out_of_range": 1})
    assert reasons(store) == [(1, "out_of_range")]
    head = pl.read_delta(store.table_uri("traces"))["topk_logprobs"].to_list()
    assert head == [[[-0.5, float(np.float32(-3e38))], [-0.25]]]  # the largest float32 magnitudes are kept
