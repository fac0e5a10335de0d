"""The end-to-end benchmark's inputs: n = 8 choices per request, one record each, real-text token IDs that
round-trip, rewards and reference logprobs keyed by request and choice; prl reads all three as the plain script
does."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _e2e():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("bench_e2e", REPO / "bench" / "e2e.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_generated_inputs_have_the_shapes_the_comparison_needs(tmp_path: Path, tokenizer_dir: str) -> None:
    from tokenizers import Tokenizer

    from prl.ingestion.side_tables import ingest_side_table
    from prl.ingestion.traces import ingest

    info = _e2e().generate(tmp_path / "data", 16, 40, 12)
    traces = [json.loads(x) for x in (tmp_path / "data" / "traces.jsonl").read_text().splitlines()]
    rewards = [json.loads(x) for x in (tmp_path / "data" / "rewards.jsonl").read_text().splitlines()]
    refs = [json.loads(x) for x in (tmp_path / "data" / "refs.jsonl").read_text().splitlines()]
    assert (info["records"], len(traces), len(rewards), len(refs)) == (16, 16, 16, 16)
    assert sorted(Counter(t["id"] for t in traces).values()) == [8, 8]
    assert [t["choices"][0]["index"] for t in traces] == list(range(8)) * 2
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    for trace, reward, ref in zip(traces, rewards, refs, strict=True):
        choices = trace["choices"]
        assert len(choices) == 1
        choice = choices[0]
        ids = trace["prompt_token_ids"] + choice["token_ids"]
        assert tok.encode(tok.decode(ids, skip_special_tokens=False), add_special_tokens=False).ids == ids
        assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in choice["token_ids"]]
        key = (trace["id"], choice["index"])
        assert (reward["request_id"], reward["choice_index"], reward["name"]) == (*key, "reward")
        assert (ref["request_id"], ref["choice_index"], ref["ref_model"]) == (*key, "ref-v1")
        assert len(ref["ref_logprobs"]) == len(choice["token_ids"])
    store = str(tmp_path / "store")
    assert ingest([str(tmp_path / "data" / "traces.jsonl")], store).samples == 16
    for name, kind in (("rewards.jsonl", "rewards"), ("refs.jsonl", "ref")):
        result = ingest_side_table([str(tmp_path / "data" / name)], store, kind=kind)
        assert (result.rows, result.quarantined) == (16, {})
