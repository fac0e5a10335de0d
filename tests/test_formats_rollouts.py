"""RL rollout dumps: verl, slime, SkyRL, prime-rl."""

from __future__ import annotations

import json

import pytest

from prl.formats.base import ParseOptions, Quarantined
from prl.formats.fields import derived_request_id
from prl.formats.prime_rl import PrimeRL
from prl.formats.registry import detect_file
from prl.formats.rollouts import SkyRL, Slime, Verl
from tests.formats_helpers import C1, C2, FIXTURES, L1, P1, P2, lines_of, parse_file, reason_of, reasons, samples

ID1 = "sha256:d494852903234ef5ca5573692aecd729"
ID2 = "sha256:931ae508eea762915a3e5a2710d053b9"


@pytest.mark.parametrize("name", ["verl", "slime", "skyrl", "prime_rl"])
def test_detected(name):
    assert detect_file(name, lines_of(FIXTURES / f"rollouts/{name}.jsonl")).name == name


def test_derived_request_id_is_stable_and_token_based():
    import pyarrow as pa

    assert derived_request_id(pa.array(P1), pa.array(C1)) == ID1
    assert derived_request_id(pa.array(P2), pa.array(C2)) == ID2
    # moving a token across the prompt/completion boundary changes the ID
    assert derived_request_id(pa.array(P1 + C1[:1]), pa.array(C1[1:])) != ID1


def test_verl_mask_nulls_tool_logprobs():
    items = parse_file("verl", "rollouts/verl.jsonl")
    s, unfinished = samples(items)
    assert (s.request_id, s.choice_index, s.finish_reason) == ("sha256:d78349937844a80ce9083b95f68f7852", 0, "stop")
    assert unfinished.finish_reason is None  # the second record kept no finish reason: ingest decides
    assert s.prompt_token_ids.to_pylist() == P1 and s.completion_token_ids.to_pylist() == C1
    assert s.completion_mask.to_pylist() == [True, True, True, False, False, True, True]
    assert s.completion_logprobs.to_pylist() == [-0.5, -0.25, -0.125, None, None, -2.0, -0.75]
    assert reasons(items) == []


def test_slime_split_status_versions_session():
    first, second = samples(parse_file("slime", "rollouts/slime.jsonl"))
    assert first.request_id == "sha256:a71528a767ba63e5276ed7c73af49a1b"
    assert first.prompt_token_ids.to_pylist() == P1
    assert first.completion_token_ids.to_pylist() == C1 and first.completion_logprobs.to_pylist() == L1
    assert first.finish_reason == "stop" and first.policy_version == "12" and first.session_id == "ep-9"
    assert first.messages == '[{"role":"user","content":"What is 2+2?"}]'
    assert first.completion_text == "The answer is 4."
    assert second.finish_reason == "length"  # status truncated
    assert second.completion_mask.to_pylist() == [True, False]
    assert second.completion_logprobs.to_pylist() == [-0.5, None]


def test_skyrl_batch_and_row():
    items = parse_file("skyrl", "rollouts/skyrl.jsonl")
    a, b, c = samples(items)
    assert [s.finish_reason for s in (a, b, c)] == ["stop", "length", "stop"]
    assert len({a.request_id, b.request_id, c.request_id}) == 3  # batch rows are salted with their row
    assert a.completion_logprobs.to_pylist() == L1 and b.completion_logprobs.to_pylist() == [-0.5, -0.25]
    assert c.prompt_token_ids.to_pylist() == P2 and c.completion_mask.to_pylist() == [True, True]


def test_prime_rl_episode_calls_are_turns_with_exact_prompts():
    items = parse_file("prime_rl", "rollouts/prime_rl.jsonl")
    first, second = samples(items)
    assert [(s.request_id, s.session_id, s.turn, s.finish_reason, s.policy_version) for s in (first, second)] == [
        ("3f2a9c1e/0", "3f2a9c1e", 0, "stop", "11"),
        ("3f2a9c1e/1", "3f2a9c1e", 1, "stop", "11"),
    ]
    assert first.prompt_token_ids.to_pylist() == P1  # the user node + the assistant node's scaffold
    assert first.completion_token_ids.to_pylist() == C1 and first.completion_logprobs.to_pylist() == L1
    # turn 1 sees everything before it: turn 0's prompt and completion, the user node, the scaffold
    assert second.prompt_token_ids.to_pylist() == [*P1, *C1, 128803, 5, 6, 7, 128804]
    assert second.completion_token_ids.to_pylist() == [25, 16, 1]
    assert second.completion_logprobs.to_pylist() == [-0.25, -0.5, -0.125]
    assert first.rewards == {"correct": 1.0, "format": 0.1}  # score × weight; "judge" did not run
    assert first.messages == '[{"role":"user","content":"What is 2+2?"}]'
    assert (first.created_at_us, first.model) == (1767225600600000, "deepseek-v4")
    assert reasons(items) == [(2, "upstream_error")]
    (_, failed), *_ = [item for item in items if item[0] == 2]
    assert "SandboxError: sandbox timed out" in failed.message


def test_prime_rl_non_trainable_agent_and_bad_masks():
    record = json.loads((FIXTURES / "rollouts/prime_rl.jsonl").read_text().splitlines()[0])
    record["traces"][0]["agent"]["trainable"] = False
    assert [q.reason for q in PrimeRL().parse(record, ParseOptions())] == ["not_trainable"]
    record["traces"][0]["agent"]["trainable"] = True
    record["traces"][0]["nodes"][3]["mask"] = [True, False, True, True]
    items = PrimeRL().parse(record, ParseOptions())
    assert [getattr(i, "reason", "sample") for i in items] == ["sample", "bad_mask"]


@pytest.mark.parametrize(
    "record",
    [
        {"input": "user: 2+2?", "output": "4", "gts": "4", "score": 1.0, "step": 3, "acc": 1.0},
        {
            "input_prompt": "<|im_start|>user 2+2?",
            "output_response": "4<|im_end|>",
            "score": [0.0, 1.0],
            "stop_reason": "stop",
            "env_class": "gsm8k",
            "env_extras": {},
            "data_source": "gsm8k",
        },
    ],
)
def test_text_only_framework_dumps_are_no_token_ids(record):
    from prl.formats.registry import detect_record

    fmt = detect_record(record)
    assert fmt is not None and fmt.name == "rl_text_dump"
    with pytest.raises(Quarantined) as info:
        fmt.parse(record, ParseOptions())
    assert info.value.reason == "no_token_ids"


def test_identical_group_members_stay_distinct_and_rereads_are_stable():
    base = {"tokens": P2 + C2, "response_length": 2, "rollout_log_probs": [-0.5, -0.25], "status": "completed"}
    a, b = ({**base, "group_index": 0, "index": i} for i in (0, 1))
    (sa,), (sb,), (sa2,) = (
        Slime().parse(a, ParseOptions()),
        Slime().parse(b, ParseOptions()),
        Slime().parse(dict(reversed(list(a.items()))), ParseOptions()),
    )
    assert sa.request_id != sb.request_id
    assert sa.request_id == sa2.request_id


@pytest.mark.parametrize(
    ("fmt", "record", "reason"),
    [
        (Verl(), {"prompt_ids": [1], "response_ids": [2], "finish_reason": "stop"}, "no_logprobs"),
        (
            Verl(),
            {
                "prompt_ids": [1],
                "response_ids": [2, 3],
                "response_logprobs": [-1.0, -1.0],
                "response_mask": [1],
                "finish_reason": "stop",
            },
            "mask_length_mismatch",
        ),
        (
            Verl(),
            {
                "prompt_ids": [1],
                "response_ids": [2],
                "response_logprobs": [-1.0],
                "response_mask": ["a"],
                "finish_reason": "stop",
            },
            "bad_mask",
        ),
        (
            Verl(),
            {
                "prompt_ids": [1],
                "response_ids": [2],
                "response_logprobs": [-1.0],
                "response_mask": [None],
                "finish_reason": "stop",
            },
            "bad_mask",
        ),
        (Verl(), {"prompt_ids": "x", "response_ids": [2]}, "bad_token_id"),
        (
            Slime(),
            {"tokens": [1, 2], "response_length": 3, "rollout_log_probs": [-1.0], "status": "completed"},
            "bad_shape",
        ),
        (Slime(), {"tokens": [1, 2], "response_length": True, "status": "completed"}, "bad_shape"),
        (
            Slime(),
            {"tokens": [1, 2], "response_length": 1, "rollout_log_probs": ["x"], "status": "completed"},
            "bad_logprob",
        ),
        (
            Slime(),
            {"tokens": [1, 2], "response_length": 1, "rollout_log_probs": [-1.0], "status": "pending"},
            "bad_finish_reason",
        ),
        (SkyRL(), {"prompt_token_ids": [[1]], "response_ids": [[2], [3]]}, "length_mismatch"),
        (
            SkyRL(),
            {
                "prompt_token_ids": [[1]],
                "response_ids": [[2]],
                "rollout_logprobs": [[-1.0, -2.0]],
                "stop_reasons": ["stop"],
            },
            "length_mismatch",
        ),
        (
            SkyRL(),
            {
                "prompt_token_ids": [[1]],
                "response_ids": [[2]],
                "rollout_logprobs": [None],
                "stop_reasons": ["stop"],
            },
            "no_logprobs",
        ),
        (PrimeRL(), {"task": {}, "ok": True, "traces": [{"id": "t", "nodes": [], "calls": []}]}, "no_token_ids"),
        (PrimeRL(), {"task": {}, "ok": True, "traces": [{"nodes": [], "calls": [{"node": 0}]}]}, "missing_request_id"),
        (
            PrimeRL(),
            {"task": {}, "ok": True, "traces": [{"id": "t", "nodes": [], "calls": [{"node": 3}]}]},
            "bad_shape",
        ),
    ],
)
def test_bad_shapes(fmt, record, reason):
    assert reason_of(fmt, record) == reason
