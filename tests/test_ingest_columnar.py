"""The columnar road stores exactly what the per-record road stores: the same traces rows (every column), the
same quarantine rows, ledger and summary, on files of chat completions with every kind of damage, edited as
decoded records and as JSON text."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prl.formats import base, registry
from prl.formats.base import ParseOptions
from prl.ingestion import reading
from prl.ingestion.chat_block import MAX_DEPTH, MAX_LINE_BYTES, Nesting, _line_bounds, parse_block
from prl.ingestion.columnar import ColumnarRun, framed_items, takes
from prl.ingestion.traces import ingest
from prl.store.tables import Store
from tests.delta_log import commit_infos
from tests.formats_helpers import json_paths, mutate
from tests.records import vllm_chat, vllm_completion

PROMPT = [0, 128803, 3085, 128804]
NUMBERS: list[Any] = [None, True, False, 0, 1, -1, 1.5, 2.0, 2**31, 2**53 + 1, 2**63, 2**70, -0.5, 0.0, -9999.0, 3.5e38]
SCALARS: st.SearchStrategy[Any] = st.sampled_from(
    [*NUMBERS, math.nan, "token_id:5", "token_id:007", "x", "stop", "eos", "bogus", "", [], {}, [1], [{}], [None]]
)
TEXT_EDITS = [
    (b'"logprob": -0.5', b'"logprob": -0'),
    (b'"logprob": -0.5', b'"logprob": true'),
    (b'"logprob": -0.5', b'"logprob": NaN'),
    (b'"logprob": -0.5', b'"logprob": -Infinity'),
    (b'"logprob": -0.5', b'"logprob": 1e400'),
    (b'"logprob": -0.5', b'"logprob": -9007199254740993'),
    (b'"logprob": -0.5', b'"logprob": -1e20'),
    (b'"logprob": -0.5', b'"logprob": -5E-1'),
    (b'"id": ', b'"\\u0069d": '),
    (b'"object": ', b'"custom_id": null, "response": null, "object": '),
    (b'"object": ', b'"response": null, "call_type": null, "object": '),
    (b'"object": ', b'"metadata": null, "session_id": null, "object": '),
    (b'"object": ', b'"id": "again", "object": '),
    (b'"content": "text"', b'"content": "caf\\u00e9 \\ud83d\\ude00"'),
    (b'"content": "text"', b'"content": "\\ud800"'),
    (b'"content": "text"', "\u00e9t\u00e9".encode()),
    (b'"content": "text"', b'"content": "\xff"'),
    (b'"content": "text"', b'"content": "a\tb"'),
    (b'"usage": ', b'"deep": ' + b"[" * 1100 + b"]" * 1100 + b', "usage": '),
    (b'"usage": ', b'"big": 123456789012345678901234567890, "usage": '),
    (b'"usage": ', b'"odd": NaN, "usage": '),
    (b'"token_ids": [5', b'"token_ids": [5.0'),
    (b'"token_ids": [5', b'"token_ids": [-0'),
    (b'"index": 0', b'"index": 0.0'),
    (b'"index": 0', b'"index": -3'),
    (b'"created": 1764460800', b'"created": 1764460800123'),
    (b'"created": 1764460800', b'"created": -5'),
    (b'"created": 1764460800', b'"created": 1.5'),
    (b'"finish_reason": "stop"', b'"finish_reason": null'),
    (b'"finish_reason": "stop"', b'"finish_reason": "eos"'),
]
WHOLE_LINES = [b"", b"   ", b"null", b"[1]", b'"x"', b"5", b"{not json", b'{"id": "a"} {"id": "b"}', b"{}"]


def _record(i: int, choices: int = 1) -> dict[str, Any]:
    completions: list[tuple[list[int], list[float | None]]] = [
        ([5, 6, 7], [-0.5, -0.25, -9999.0]),
        ([8, 1], [-1.5, None]),
    ]
    return vllm_chat(f"req-{i}", PROMPT, [completions[k % 2] for k in range(choices)])


def _text(record: Any) -> bytes:
    return json.dumps(record, allow_nan=True).encode()


def _stored(store: Store, source: Path) -> dict[str, Any]:
    """Everything an ingest of ``source`` left that must not depend on the road: tables (less the clock),
    ledger, summary."""
    traces = store.read("traces")
    quarantine = store.read("quarantine")
    out: dict[str, Any] = {
        "traces": None if traces is None else traces.drop_columns(["ingested_at"]).to_pylist(),
        "quarantine": None if quarantine is None else quarantine.drop_columns(["quarantined_at"]).to_pylist(),
        "ledger": [commit_infos(store, "traces", limit=1)[0].get("prl.sources")],
    }
    return out


def _taken(lines: list[bytes]) -> int:
    """Records of ``lines`` the columnar road takes."""
    chat = registry.per_record(registry.by_name("openai_chat"))
    items = framed_items(chat, [(1, b"".join(line + b"\n" for line in lines))], ParseOptions(), "u", 0)
    return sum(item.records for item in items if isinstance(item, ColumnarRun))


def _both_roads(tmp_path: Path, lines: list[bytes], monkeypatch: pytest.MonkeyPatch, **options: Any) -> dict:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    results = []
    for road in ("columnar", "per_record"):
        with monkeypatch.context() as patch:
            if road == "per_record":
                patch.setattr(reading, "takes", lambda fmt, opts: False)
            store = Store(str(tmp_path / f"store-{road}-{len(list(tmp_path.iterdir()))}"))
            result = ingest([str(source)], store, max_quarantine_rate=None, **options)
            summary = {k: v for k, v in result.to_json().items() if k not in ("seconds", "store", "tokens_per_second")}
            results.append(_stored(store, source) | {"summary": summary})
    columnar, per_record = results
    for key in ("traces", "quarantine", "ledger", "summary"):
        assert columnar[key] == per_record[key], key
    return columnar


def test_clean_records_take_the_columnar_road_and_store_what_the_per_record_road_stores(tmp_path, monkeypatch):
    lines = [_text(_record(i, choices=1 + i % 3)) for i in range(50)]
    source = tmp_path / "a.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    chat = registry.per_record(registry.by_name("openai_chat"))
    items = list(framed_items(chat, [(1, source.read_bytes())], ParseOptions(), "u", 0))
    assert [type(item).__name__ for item in items] == ["ColumnarRun"] and items[0].records == 50
    assert items[0].batch.num_rows == 99  # 1, 2 or 3 choices each
    stored = _both_roads(tmp_path, lines, monkeypatch)
    assert len(stored["traces"]) == 99 and stored["quarantine"] == []
    assert stored["traces"][0]["completion_logprobs"] == [-0.5, -0.25, None]


def test_damaged_lines_go_to_the_per_record_road_with_their_reasons(tmp_path, monkeypatch):
    lines = []
    for i, (old, new) in enumerate(TEXT_EDITS):
        text = _text(_record(i, choices=2))
        assert old in text, old
        lines += [_text(_record(1000 + i)), text.replace(old, new, 1)]
    lines += [*WHOLE_LINES, b"\xef\xbb\xbf" + _text(_record(2000))]
    lines += [_text(_record(1001)), _text(_record(1000)).replace(b"-0.25", b"-0.75")]  # present, then a duplicate
    stored = _both_roads(tmp_path, lines, monkeypatch)
    reasons = {row["reason"] for row in stored["quarantine"]}
    assert {"bad_logprob", "nonfinite_logprob", "malformed_json", "too_deep", "bad_string"} <= reasons
    assert "duplicate_sample_id" in reasons and stored["summary"]["already_present"] == 1
    taken = [new for old, new in TEXT_EDITS if _taken([_text(_record(0)).replace(old, new, 1)]) == 1]
    assert taken == [  # what both decoders read as Arrow does; every other edit goes to the per-record road
        b'"logprob": -5E-1',
        b'"metadata": null, "session_id": null, "object": ',
        b'"content": "caf\\u00e9 \\ud83d\\ude00"',
        b'"big": 123456789012345678901234567890, "usage": ',
        b'"odd": NaN, "usage": ',
        b'"index": -3',
        b'"created": 1764460800123',
        b'"created": -5',
        b'"finish_reason": "eos"',
    ]
    assert _taken([*WHOLE_LINES, b"\xef\xbb\xbf" + _text(_record(0))]) == 0


def test_lines_longer_than_an_arrow_block_go_to_the_per_record_road_and_its_record_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "MAX_RECORD_BYTES", 3 * MAX_LINE_BYTES // 2)
    long_prompt = list(range(1, 150_001))  # one "[": within the nesting the road takes
    long = _text(vllm_chat("long", long_prompt, [([5, 6, 7], [-0.5, -0.25, -1.0])]))
    over = _text(vllm_chat("over", long_prompt * 2, [([5], [-0.5])]))
    assert MAX_LINE_BYTES < len(long) < base.MAX_RECORD_BYTES < len(over)
    assert _taken([long]) == 0 and _taken([over]) == 0 and _taken([_text(_record(0))]) == 1
    stored = _both_roads(tmp_path, [_text(_record(0)), long, over, _text(_record(1))], monkeypatch)
    assert len(stored["traces"]) == 3 and len(stored["traces"][1]["prompt_token_ids"]) == 150_000
    assert [(row["source_line"], row["reason"]) for row in stored["quarantine"]] == [(3, "line_too_long")]


def test_options_and_batch_boundaries_inside_runs(tmp_path, monkeypatch):
    lines = [_text(_record(i, choices=1 + i % 2)) for i in range(40)]
    lines[7] = lines[7].replace(b'"finish_reason": "stop"', b'"finish_reason": null')
    lines[20] = lines[20].replace(b'"token_ids": [5', b'"token_ids": [-5')
    lines[30] = _text(_record(3))  # the same sample again
    stored = _both_roads(tmp_path, lines, monkeypatch, batch_tokens=23, policy_version="v7", finish_reason="length")
    assert {row["policy_version"] for row in stored["traces"]} == {"v7"}
    assert [row["reason"] for row in stored["quarantine"]] == ["token_mismatch"]  # the tokens spell 5


def test_a_file_ending_mid_line_and_one_with_crlf(tmp_path, monkeypatch):
    source = tmp_path / "crlf.jsonl"
    source.write_bytes(b"".join(_text(_record(i)) + b"\r\n" for i in range(5)) + _text(_record(9))[:-3])
    store = Store(str(tmp_path / "s"))
    result = ingest([str(source)], store, partial_line_grace=0.0)
    assert (result.samples, result.quarantined) == (5, {"truncated_line": 1})


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_mutated_records_store_the_same_on_both_roads(tmp_path_factory, monkeypatch, data):
    records: list[Any] = [_record(i, choices=1 + i % 2) for i in range(6)]
    records[1] |= {"session_id": "s-1", "turn": 1, "metadata": {"weight_version": 3, "user": "u"}}
    records[4] |= {"messages": [{"role": "user", "content": "hi"}], "agent_name": "critic"}
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, 5))
        record = copy.deepcopy(records[i])
        path = data.draw(st.sampled_from(json_paths(record)))
        records[i] = mutate(record, path, data.draw(SCALARS), data.draw(st.booleans()))
    lines = [_text(r) for r in records]
    for _ in range(data.draw(st.integers(0, 2))):
        i = data.draw(st.integers(0, 5))
        old, new = data.draw(st.sampled_from(TEXT_EDITS))
        lines[i] = lines[i].replace(old, new, 1)
    _both_roads(tmp_path_factory.mktemp("fuzz"), lines, monkeypatch)


def test_road_takes_only_completion_files_without_field_options():
    chat = registry.per_record(registry.by_name("openai_chat"))
    assert takes(chat, ParseOptions()) and takes(registry.by_name("openai_chat"), ParseOptions(policy_version="x"))
    assert not takes(chat, ParseOptions(group_field="g")) and not takes(chat, ParseOptions(agent_field="a"))
    assert takes(registry.by_name("openai_completions"), ParseOptions())
    assert not takes(registry.by_name("sse"), ParseOptions())
    assert not takes(registry.by_name("sglang_generate"), ParseOptions())


def test_arrow_reads_logprobs_bit_for_bit_as_the_decoders_do():
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [-rng.exponential(2, 4000), -rng.random(1000) * 1e-300, -(10.0 ** rng.uniform(-320, 30, 2000))]
    )
    texts = [repr(float(v)) for v in values] + [f"{v:.25e}" for v in values[:1000]] + [f"-{n}" for n in range(1, 500)]
    lines = []
    for i in range(0, len(texts), 50):
        chunk = texts[i : i + 50]
        record = vllm_chat(f"r{i}", PROMPT, [(list(range(len(chunk))), [-0.5] * len(chunk))])
        pieces = _text(record).split(b'"logprob": -0.5')
        written = [b'"logprob": ' + t.encode() + piece for t, piece in zip(chunk, pieces[1:], strict=True)]
        lines.append(pieces[0] + b"".join(written))
    data = b"".join(line + b"\n" for line in lines)
    parsed = parse_block(data)
    assert parsed.table.num_rows == len(lines)
    content = parsed.table.column("choices").combine_chunks().flatten().field("logprobs").field("content")
    read = content.flatten().field("logprob").to_numpy()
    decoded = np.array(
        [e["logprob"] for line in lines for e in orjson.loads(line)["choices"][0]["logprobs"]["content"]], np.float64
    )
    assert len(read) == len(texts) and (read.view(np.int64) == decoded.view(np.int64)).all()


def test_a_source_of_records_the_road_does_not_take_is_framed_line_by_line_after_two_blocks(monkeypatch):
    from prl.ingestion import columnar

    parsed = []
    real = columnar.parse_block
    monkeypatch.setattr(columnar, "parse_block", lambda data: parsed.append(data) or real(data))
    heads = [[[(5, -0.5), (9, -1.0)]]]  # a top-k head: the chat reader's rules, the per-record road
    with_heads = [_text(vllm_chat(f"m{i}", PROMPT, [([5], [-0.5])], heads=heads)) for i in range(40)]
    blocks = [(1 + 10 * k, b"".join(line + b"\n" for line in with_heads[10 * k : 10 * k + 10])) for k in range(4)]
    chat = registry.per_record(registry.by_name("openai_chat"))
    items = list(framed_items(chat, blocks, ParseOptions(), "u", 0))
    assert [(item.line, item.obj["id"]) for item in items] == [(1 + i, f"m{i}") for i in range(40)]
    assert len(parsed) == 3  # the third block is read ahead while the second is taken; the fourth is not read


def test_genuine_vllm_chat_with_heads_stores_the_same_exact_heads_on_both_roads(tmp_path, monkeypatch):
    """Recorded vLLM chat answers (tests/fixtures/vllm_cpu/PROVENANCE.md) carry top-k heads, which the columnar road
    hands to the per-record reader: both roads store the same rows, heads cut to the exact top k - 1."""
    lines = (Path(__file__).parent / "fixtures/vllm_cpu/chat.jsonl").read_bytes().splitlines()
    assert _taken(lines) == 0
    stored = _both_roads(tmp_path, lines, monkeypatch)
    assert len(stored["traces"]) == 5 and stored["quarantine"] == []
    assert {len(h) for row in stored["traces"] for h in row["topk_ids"]} == {2}


def test_records_naming_a_session_metadata_messages_a_version_or_an_agent_take_the_road_with_those_fields(
    tmp_path, monkeypatch
):
    records = [_record(i, choices=1 + i % 2) for i in range(7)]
    records[1] |= {"session_id": "s-1", "turn": 2}
    records[2]["metadata"] = {"session_id": 7, "turn": 1, "weight_version": 12}
    records[3] |= {"messages": [{"role": "user", "content": "hi"}], "agent_id": "planner"}
    records[4]["sglext"] = {"weight_version": "w-sgl"}
    records[4]["choices"][0]["weight_version"] = "w-3"  # the choice's version first
    records[5]["metadata"] = {"agent_name": "critic"}
    records[6] |= {"metadata": None, "session_id": None}  # present, null: a bare response
    lines = [_text(record) for record in records]
    assert _taken(lines) == 7
    stored = _both_roads(tmp_path, lines, monkeypatch, policy_version="fallback")
    fields = [
        (row["source_line"], row["session_id"], row["turn"], row["policy_version"], row["agent_id"], row["messages"])
        for row in stored["traces"]
    ]
    assert fields == [
        (1, None, None, "fallback", None, None),
        (2, "s-1", 2, "fallback", None, None),
        (2, "s-1", 2, "fallback", None, None),
        (3, "7", 1, "12", None, None),
        (4, None, None, "fallback", "planner", '[{"role":"user","content":"hi"}]'),
        (4, None, None, "fallback", "planner", '[{"role":"user","content":"hi"}]'),
        (5, None, None, "w-3", None, None),
        (6, None, None, "fallback", "critic", None),
        (6, None, None, "fallback", "critic", None),
        (7, None, None, "fallback", None, None),
    ]


def test_marked_records_the_reader_would_not_keep_as_they_are_go_to_the_per_record_road(tmp_path, monkeypatch):
    surrogate, wide, deep_turn, listed, enveloped = (_record(i) for i in range(5))
    surrogate["session_id"] = "\ud83d"  # valid JSON, not valid Unicode: bad_string
    wide["turn"] = 2**31  # beyond int32: out_of_range
    deep_turn["metadata"] = {"turn": 2**70}  # beyond 64 bits: the standard library's decoder, out_of_range
    listed["choices"][0]["weight_version"] = True  # not a version: the record's next candidate
    enveloped |= {"request": {"body": {"model": "m"}}, "response": None}  # an HTTP envelope claims it
    lines = [_text(record) for record in (surrogate, wide, deep_turn, listed, enveloped)]
    assert [_taken([line]) for line in lines] == [0, 0, 0, 1, 0]
    stored = _both_roads(tmp_path, lines, monkeypatch)
    assert [(row["source_line"], row["reason"]) for row in stored["quarantine"]] == [
        (1, "bad_string"),
        (2, "out_of_range"),
        (3, "out_of_range"),
        (5, "bad_shape"),
    ]
    assert [(row["source_line"], row["policy_version"]) for row in stored["traces"]] == [(4, None)]


def _nesting(line: bytes) -> int:
    """The deepest nesting of a JSON text, read byte by byte."""
    depth = deepest = 0
    inside = escaped = False
    for byte in line:
        if inside:
            escaped, inside = (False, True) if escaped else (byte == 0x5C, byte != 0x22)
        elif byte == 0x22:
            inside = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


JSON_VALUES = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\ax', max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(JSON_VALUES, min_size=1, max_size=5), junk=st.binary(max_size=12))
def test_nesting_is_counted_outside_strings(values, junk):
    lines = [json.dumps({"v": value}).encode() for value in values]
    data = b"\n".join([junk.replace(b"\n", b""), *lines]) + b"\n"  # a line of junk first: its quotes count not
    starts, ends = _line_bounds(data)
    bytes_ = np.frombuffer(data, dtype=np.uint8)
    nesting = Nesting.of(bytes_, bytes_ | 0x20, starts, ends)
    assert nesting.deepest(len(starts))[1:].tolist() == [_nesting(line) for line in lines]


def test_long_records_take_the_road_unless_nested_too_deep(tmp_path, monkeypatch):
    ids = list(range(1, 601))
    long = vllm_chat("long", PROMPT, [(ids, [-0.5] * 600)])  # 600 logprob entries: over MAX_DEPTH openers
    bracketed = copy.deepcopy(long) | {"id": "bracketed", "note": "[{" * 600 + '\\"' + "[" * 3}
    deep = copy.deepcopy(long) | {"id": "deep", "extra": json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))}
    lines = [_text(long), _text(bracketed), _text(deep)]
    assert lines[0].count(b"{") > MAX_DEPTH and [_taken([line]) for line in lines] == [1, 1, 0]
    stored = _both_roads(tmp_path, lines, monkeypatch)
    assert [row["request_id"] for row in stored["traces"]] == ["long", "bracketed", "deep"]


KEYS = st.sampled_from(["choices", "token_ids", "logprobs", "prompt_token_ids", "metadata", "x", 'a"b', "c\\d"])


@settings(max_examples=200, deadline=None)
@given(
    extras=st.dictionaries(KEYS, JSON_VALUES, max_size=3),
    choice_extras=st.dictionaries(KEYS.filter(lambda k: k not in ("token_ids", "logprobs")), JSON_VALUES, max_size=2),
    indent=st.sampled_from([None, 1]),
    first=st.booleans(),
)
def test_a_record_without_its_token_lists_decodes_to_every_other_field_as_it_is(extras, choice_extras, indent, first):
    record = vllm_chat("r", PROMPT, [([5, 6], [-0.5, -0.25]), ([7], [-1.0])])
    extras = {k: v for k, v in extras.items() if k not in record}
    record = extras | record if first else record | extras
    record["choices"][1] |= {**choice_extras, "extra": {"token_ids": [1, 2], "logprobs": {"content": []}}}
    line = json.dumps(record, indent=indent).replace("\n", " ").encode()
    data = b'{"junk": "\\"[" }\n' + line + b"\n"
    starts, ends = _line_bounds(data)
    bytes_ = np.frombuffer(data, dtype=np.uint8)
    text = Nesting.of(bytes_, bytes_ | 0x20, starts, ends).without_tokens(data, int(starts[1]), int(ends[1]), 1)
    assert text is not None
    expected = json.loads(line)
    expected["prompt_token_ids"] = []
    for choice in expected["choices"]:
        choice |= {"token_ids": [], "logprobs": {}}
        if isinstance(choice.get("prompt_token_ids"), list):  # a text completion's own prompt
            choice["prompt_token_ids"] = []
    assert orjson.loads(text) == expected


def _completion(i: int, choices: int = 1) -> dict[str, Any]:
    """A vLLM text completion of one or two choices, each with its own prompt IDs."""
    record = vllm_completion(f"cmpl-{i}", [0, 128803, 3085], [5, 6, 1], [-0.5, -9999.0, None])
    if choices > 1:
        second = copy.deepcopy(record["choices"][0]) | {"index": 1, "token_ids": [8, 1], "finish_reason": "stop"}
        second["logprobs"] |= {"token_logprobs": [-1.5, -0.25], "tokens": ["token_id:8", "token_id:1"]}
        record["choices"].append(second)
    return record


def test_text_completions_take_the_road_and_store_what_the_per_record_road_stores(tmp_path, monkeypatch):
    records = [_completion(i, choices=1 + i % 2) for i in range(14)]
    records[1]["metadata"] = {"turn": 3, "session_id": "s"}
    records[2]["prompt_token_ids"] = records[2]["choices"][0].pop("prompt_token_ids")  # the record's prompt
    records[3]["choices"][0]["logprobs"]["tokens"] = ["a", "b", "c"]  # text tokens: nothing to compare
    records[4]["choices"][0]["logprobs"]["top_logprobs"] = [None, None, None]  # no head at the first position
    records[5]["choices"][0]["logprobs"]["tokens"][2] = "token_id:2"  # token_mismatch
    records[6]["choices"][0]["logprobs"]["top_logprobs"] = [{"token_id:5": -0.5}, {}, {}]  # heads: the reader's
    records[7]["choices"][0]["logprobs"]["token_logprobs"][0] = True  # bad_logprob
    records[8]["choices"][0]["logprobs"]["tokens"][1] = "b"  # the first spelled, a later one not
    records[9]["choices"][0]["prompt_token_ids"] = None  # present and null: no prompt for its reader
    records[9]["prompt_token_ids"] = [0, 1]
    records[10]["choices"][0]["token_ids"] = None  # the IDs only in the spelled tokens
    records[11]["choices"][0]["finish_reason"] = None
    records[12]["choices"][0]["logprobs"]["token_logprobs"] = [-0.5, -0.25]  # fewer logprobs than IDs
    records[13]["choices"][0]["logprobs"]["top_logprobs"] = []
    lines = [_text(record) for record in records]
    assert [_taken([line]) for line in lines] == [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    stored = _both_roads(tmp_path, lines, monkeypatch)
    assert [(row["source_line"], row["reason"]) for row in stored["quarantine"]] == [
        (6, "token_mismatch"),
        (8, "bad_logprob"),
        (9, "no_token_ids"),
        (10, "no_token_ids"),
        (12, "missing_finish_reason"),
        (13, "length_mismatch"),
    ]
    assert {row["source_format"] for row in stored["traces"]} == {"openai_completions"}
    assert stored["summary"]["files"][0]["formats"] == {"openai_completions": 14}
    first = stored["traces"][0]
    assert (first["prompt_token_ids"], first["completion_token_ids"], first["completion_logprobs"]) == (
        [0, 128803, 3085],
        [5, 6, 1],
        [-0.5, None, None],
    )
    assert [(row["source_line"], row["session_id"], row["turn"]) for row in stored["traces"][1:4]] == [
        (2, "s", 3),
        (2, "s", 3),
        (3, None, None),
    ]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_mutated_text_completions_among_chat_records_store_the_same_on_both_roads(tmp_path_factory, monkeypatch, data):
    records: list[Any] = [_completion(0, 2), _record(1, choices=2), _completion(2), _completion(3, 2)]
    records[3]["metadata"] = {"turn": 1, "policy_version": 4}
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, 3))
        record = copy.deepcopy(records[i])
        path = data.draw(st.sampled_from(json_paths(record)))
        records[i] = mutate(record, path, data.draw(SCALARS), data.draw(st.booleans()))
    options = data.draw(st.sampled_from([{}, {"finish_reason": "stop"}, {"policy_version": "p"}]))
    _both_roads(tmp_path_factory.mktemp("fuzz"), [_text(r) for r in records], monkeypatch, **options)


@pytest.mark.parametrize("forced", ["openai_chat", "openai_completions"])
def test_a_named_format_reads_records_of_the_other_kind_as_its_own_on_both_roads(tmp_path, monkeypatch, forced):
    chat, text = _record(0), _completion(1)
    chat["metadata"] = {"session_id": "s"}
    text["metadata"] = {"session_id": "t"}
    lines = [_text(chat), _text(text), _text(_record(2)), _text(_completion(3))]
    stored = _both_roads(tmp_path, lines, monkeypatch, format=forced)
    own = [1, 3] if forced == "openai_chat" else [2, 4]
    assert sorted({row["source_line"] for row in stored["traces"]}) == own
    assert {row["source_format"] for row in stored["traces"]} == {forced}
    assert sorted({row["source_line"] for row in stored["quarantine"]}) == sorted({1, 2, 3, 4} - set(own))
    assert stored["summary"]["files"][0]["formats"] == {forced: 4}


def test_genuine_vllm_text_completions_store_the_same_on_both_roads(tmp_path, monkeypatch):
    """Recorded vLLM /v1/completions answers (tests/fixtures/vllm_cpu/PROVENANCE.md) carry top-k heads, which
    leave them to their reader; the same answers without heads (``top_logprobs`` null, as asked with no
    ``logprobs`` heads) take the road. Both roads store the same rows either way."""
    lines = (Path(__file__).parent / "fixtures/vllm_cpu/text.jsonl").read_bytes().splitlines()
    assert _taken(lines) == 0
    (tmp_path / "heads").mkdir()
    (tmp_path / "bare").mkdir()
    with_heads = _both_roads(tmp_path / "heads", lines, monkeypatch)
    bare = []
    for line in lines:
        record = json.loads(line)
        for choice in record["choices"]:
            choice["logprobs"]["top_logprobs"] = None
        bare.append(_text(record))
    assert _taken(bare) == len(bare)
    without = _both_roads(tmp_path / "bare", bare, monkeypatch)
    assert len(without["traces"]) == len(with_heads["traces"]) > 0 and without["quarantine"] == []
    assert [row["completion_token_ids"] for row in without["traces"]] == [
        row["completion_token_ids"] for row in with_heads["traces"]
    ]
    assert {row["source_format"] for row in without["traces"]} == {"openai_completions"}
