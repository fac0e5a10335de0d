"""The plain walk of text completions and its token blocks give exactly what ``parse`` gives: the same rows,
the same quarantine reasons and messages, record by record, on records mutated at random."""

from __future__ import annotations

import copy
import gc
import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prl.formats import registry
from prl.formats.base import ParseOptions, Quarantined, decode_json_line
from prl.formats.guard import apply_options, read_record, source_position
from prl.ingestion.assemble import Located, sample_id_of
from prl.ingestion.batch import check_and_assemble
from prl.ingestion.collect import Collector
from prl.ingestion.token_block import TokenBlock
from tests.formats_helpers import json_paths, mutate
from tests.records import vllm_chat, vllm_completion

FMT = registry.per_record(registry.by_name("openai_chat"))
NUMBERS = [None, True, False, 0, 1, -1, 1.5, 2**31, 2**63, 2**70, -0.5, 0.0, -9999.0, 3.5e38, math.nan, math.inf]
SCALARS = st.sampled_from(
    [*NUMBERS, "token_id:5", "token_id:x", "token_id:007", "x", "stop", "length", "bogus", "", [], {}, [1], [{}]]
)


def _text_completion(i: int) -> dict[str, Any]:
    record = vllm_completion(f"cmpl-{i}", [0, 128803, 3085], [5, 6, 1], [-0.5, -9999.0, None])
    record["choices"].append({**copy.deepcopy(record["choices"][0]), "index": 1, "finish_reason": None})
    return record


def _base(i: int) -> dict[str, Any]:
    """A text completion of one or two choices (both with a finish reason), with metadata."""
    record = _text_completion(i)
    record["choices"] = record["choices"][: 1 + i % 2]
    record["choices"][-1]["finish_reason"] = "stop"
    record["metadata"] = {"turn": i}
    return record


def _lines(records: list[Any]) -> list[bytes]:
    return [json.dumps(r, allow_nan=True).encode() for r in records]


def _collected(lines: list[bytes], options: ParseOptions) -> tuple[list[Located], list[tuple]]:
    quarantined: list[tuple] = []

    def quarantine(line: int, raw: bytes, q: Quarantined, sample_id: str | None = None, **_: Any) -> None:
        quarantined.append((line, q.reason, q.message, q.choice_index, sample_id))

    collector = Collector(FMT, options, "u", quarantine)
    for line, raw in enumerate(lines, start=1):
        record = decode_json_line(line, raw)
        if record.error is not None:
            quarantined.append((line, record.error.reason))
            continue
        collector.add(record, source_position("k", line))
    rows, _ = collector.take()
    return rows, quarantined


def _parsed(lines: list[bytes], options: ParseOptions) -> tuple[list[Located], list[tuple]]:
    """What ingest gave when every record went through ``parse``."""
    rows: list[Located] = []
    quarantined: list[tuple] = []
    for line, raw in enumerate(lines, start=1):
        record = decode_json_line(line, raw)
        if record.error is not None:
            quarantined.append((line, record.error.reason))
            continue
        name, items = read_record(FMT, record.obj, options, source_position("k", line))
        for item in items:
            if isinstance(item, Quarantined):
                quarantined.append((line, item.reason, item.message, item.choice_index, None))
                continue
            try:
                rows.append(Located(apply_options(item, options, record.obj), "u", line, name))
            except Quarantined as q:
                quarantined.append((line, q.reason, q.message, item.choice_index, sample_id_of(item)))
    return rows, quarantined


def _outcome(rows: list[Located]) -> tuple[list[dict], list[tuple]]:
    checked = check_and_assemble(rows, 5)
    rejected = [(rows[i].source_line, q.reason, q.message) for i, q in checked.rejected]
    return checked.batch.to_pylist(), rejected


def _same(records: list[Any], options: ParseOptions | None = None) -> list[Located]:
    options = options or ParseOptions()
    lines = _lines(records)
    plain_rows, plain_q = _collected(lines, options)
    parsed_rows, parsed_q = _parsed(lines, options)
    assert plain_q == parsed_q
    assert [(r.source_line, r.sample.choice_index) for r in plain_rows] == [
        (r.source_line, r.sample.choice_index) for r in parsed_rows
    ]
    plain_out, parsed_out = _outcome(plain_rows), _outcome(parsed_rows)
    assert plain_out[1] == parsed_out[1]
    assert plain_out[0] == parsed_out[0]
    return plain_rows


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_text_completions_read_as_parse_reads_them(data):
    records = [_base(i) for i in range(4)]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, 3))
        record = copy.deepcopy(records[i])
        path = data.draw(st.sampled_from(json_paths(record)))
        records[i] = mutate(record, path, data.draw(SCALARS), data.draw(st.booleans()))
    _same(records)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_text_completions_among_chat_records_read_as_parse_reads_them(data):
    chat = vllm_chat("req-1", [0, 128803, 3085, 128804], [([5, 6, 7], [-0.5, -0.25, -9999.0])], metadata={"turn": 1})
    records = [_text_completion(0), chat, _text_completion(2), _text_completion(3)]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, 3))
        record = copy.deepcopy(records[i])
        path = data.draw(st.sampled_from(json_paths(record)))
        records[i] = mutate(record, path, data.draw(SCALARS), data.draw(st.booleans()))
    _same(records, ParseOptions(finish_reason="stop"))


def test_text_completions_take_the_block():
    records = [_text_completion(i) for i in range(4)]
    records[1]["choices"][1]["logprobs"]["tokens"][2] = "token_id:2"  # disagrees with token_ids
    records[2]["choices"][0]["logprobs"]["top_logprobs"] = [{"token_id:5": -0.5}, {}, {}]  # heads: parse
    records[3]["choices"][0]["logprobs"]["token_logprobs"][0] = True  # bad_logprob
    rows = _same(records, ParseOptions(finish_reason="stop"))
    assert [(r.source_line, r.sample.choice_index, r.block is not None) for r in rows] == [
        (1, 0, True),
        (1, 1, True),
        (2, 0, False),
        (3, 0, False),
        (3, 1, False),
        (4, 1, False),
    ]


def test_clean_records_take_the_block_and_a_bad_one_alone_goes_to_parse():
    records = [_base(i) for i in range(6)]
    records[2]["choices"][0]["prompt_token_ids"][1] = 1.5  # bad_token_id, found only when the block converts
    records[4]["choices"][0]["logprobs"]["tokens"][0] = "token_id:9"  # disagrees with token_ids
    rows = _same(records)
    assert [(r.source_line, r.block is not None) for r in rows] == [
        (1, True),
        (2, True),
        (2, True),
        (4, True),
        (4, True),
        (6, True),
        (6, True),
    ]
    blocks = {id(r.block) for r in rows}
    assert len(blocks) == 1 and isinstance(rows[0].block, TokenBlock)


def test_options_apply_to_plain_samples():
    records = [_base(i) for i in range(3)]
    records[1]["metadata"]["group"] = "g1"
    for record in records:
        record["choices"][0]["finish_reason"] = None
    options = ParseOptions(group_field="group", finish_reason="length", agent_field="turn")
    rows = _same(records, options)
    assert [(r.sample.group_key, r.sample.finish_reason, r.sample.agent_id) for r in rows] == [
        ("g1", "length", "1"),
        ("g1", "stop", "1"),
    ]
    assert all(r.block is not None for r in rows)


def test_strings_that_are_not_unicode_and_out_of_range_scalars():
    surrogate, wide, accented = _base(0), _base(1), _base(2)
    surrogate["model"] = "\ud83d"  # valid JSON, not valid Unicode: bad_string
    wide["metadata"]["turn"] = 2**31  # beyond int32: out_of_range
    accented["choices"][0]["text"] = "café"
    rows = _same([surrogate, wide, accented])
    assert [(r.source_line, r.block is not None) for r in rows] == [(3, True)]
    _, quarantined = _collected(_lines([surrogate, wide, accented]), ParseOptions())
    assert [(q[0], q[1], q[3]) for q in quarantined] == [
        (1, "bad_string", 0),
        (2, "out_of_range", 0),
        (2, "out_of_range", 1),
    ]


def test_ingest_of_plain_and_refused_records_restores_the_collector(tmp_path):
    from prl.ingestion.traces import ingest

    records = [_base(i) for i in range(200)]
    for record in records[3:]:
        record["choices"][0]["logprobs"]["tokens"][0] = "token_id:9"  # token_mismatch, read by parse
    source = tmp_path / "completions.jsonl"
    source.write_bytes(b"\n".join(_lines(records)) + b"\n")
    result = ingest([str(source)], str(tmp_path / "store"))
    assert gc.isenabled()
    # the first three records' 4 choices, and the clean second choice of the 99 odd-numbered others
    assert (result.samples, result.quarantined) == (4 + 99, {"token_mismatch": 197})
