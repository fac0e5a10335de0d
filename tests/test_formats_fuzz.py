"""Property tests: whatever a reader is given, ``frame`` never raises and ``parse`` raises nothing but
``Quarantined`` — random JSON, fixture records with random mutations, and lines cut at random bytes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prl.formats import registry
from prl.formats.base import ParseOptions, Quarantined, Sample
from prl.formats.sse.exact import frame_decoded
from tests.formats_helpers import FIXTURES, json_paths

FIXTURE_OF = {
    "vllm_generate": "vllm_generate/generate.jsonl",
    "vllm_request_output": "vllm_generate/request_output.jsonl",
    "tgi": "tgi/tgi.jsonl",
    "verl": "rollouts/verl.jsonl",
    "slime": "rollouts/slime.jsonl",
    "skyrl": "rollouts/skyrl.jsonl",
    "prime_rl": "rollouts/prime_rl.jsonl",
    "openai_text": "openai_text/openai_text.jsonl",
    "openai_batch": "envelopes/openai_batch.jsonl",
    "proxy_capture": "envelopes/proxy_capture.jsonl",
    "litellm_log": "envelopes/litellm_log.jsonl",
    "sse": "sse/streams.sse",
}
NAMES = sorted(FIXTURE_OF)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["token_id:5", "token_id:x", "stop", "eos_token", "chat.completion.chunk", "text_completion"])
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


def _check(name: str, obj: Any) -> None:
    fmt = registry.by_name(name)
    try:
        out = fmt.parse(obj, ParseOptions())
    except Quarantined:
        return
    assert isinstance(out, list)
    assert all(isinstance(item, (Sample, Quarantined)) for item in out)


def _records(name: str) -> list[Any]:
    """Decoded records of a fixture (SSE streams with their chunks decoded, not as framed lines)."""
    fmt = registry.by_name(name)
    lines = list(enumerate((FIXTURES / FIXTURE_OF[name]).read_bytes().splitlines(), start=1))
    framed = frame_decoded(iter(lines)) if name == "sse" else fmt.frame(iter(lines))
    return [r.obj for r in framed if r.error is None]


def _mutate(obj: Any, path: tuple, how: str, value: Any) -> Any:
    if not path:
        return value if how == "replace" else obj
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if how == "delete":
        del parent[last]
    elif how == "truncate" and isinstance(parent[last], (list, str)):
        parent[last] = parent[last][: len(parent[last]) // 2]
    else:
        parent[last] = value
    return obj


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(obj=json_values)
def test_random_json_only_quarantines(name, obj):
    _check(name, obj)


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(data=st.data())
def test_mutated_records_only_quarantine(name, data):
    records = _records(name)
    record = copy.deepcopy(data.draw(st.sampled_from(records)))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = json_paths(record)
        path = data.draw(st.sampled_from(paths))
        how = data.draw(st.sampled_from(["replace", "delete", "truncate"]))
        record = _mutate(record, path, how, data.draw(json_values))
    _check(name, record)


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(data=st.data())
def test_cut_lines_never_crash_frame(name, data):
    fmt = registry.by_name(name)
    raw = (FIXTURES / FIXTURE_OF[name]).read_bytes()
    cut = data.draw(st.integers(0, len(raw)))
    junk = data.draw(st.binary(max_size=20))
    lines = list(enumerate((raw[:cut] + junk).splitlines(), start=1))
    for record in fmt.frame(iter(lines)):
        if record.error is None:
            _check(name, record.obj)


@FUZZ
@given(
    lines=st.lists(st.binary(max_size=40) | st.sampled_from([b"data: [DONE]", b"data: {}", b": x", b""]), max_size=12)
)
def test_sse_frame_random_lines(lines):
    fmt = registry.by_name("sse")
    for record in fmt.frame(iter(enumerate(lines, start=1))):
        if record.error is None:
            _check("sse", record.obj)


def test_fixture_records_are_json_round_trippable():
    for name in NAMES:
        for record in _records(name):
            json.dumps(record)


@pytest.mark.parametrize(
    ("name", "record"),
    [
        (
            "vllm_request_output",
            {
                "prompt_token_ids": [1],
                "outputs": [
                    {"token_ids": [2, 3], "finish_reason": "stop", "logprobs": [[None], {"3": {"logprob": -0.25}}]}
                ],
            },
        ),
        (
            "vllm_request_output",
            {
                "prompt_token_ids": [1],
                "outputs": [{"token_ids": [2], "finish_reason": "stop", "logprobs": [[["a", None]]]}],
            },
        ),
    ],
)
def test_map_shaped_lists_are_quarantined_not_a_crash(name, record):
    # Arrow aborts the process when a map entry is a list holding null; readers must refuse it first
    (item,) = registry.by_name(name).parse(record, ParseOptions())
    assert isinstance(item, Quarantined)
    assert (item.reason, item.choice_index) == ("bad_logprob", 0)
    assert "must be a list of JSON objects" in item.message
