"""The loop in a box (``loop/``): the trainer step's direction with and without each planted fault, on a tiny
model built here, and (marked genuine, in ``make test-all``) a short loop through a real vLLM server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from loop.policy import FAULTS, completion_logprobs, grpo_loss, loss_mask, plant, reward  # noqa: E402
from tests.genuine_engines import vllm_skip_reason  # noqa: E402

TARGET = 5
PROMPT = [1, 2, 3]
REPLY = 4


def _model(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=12,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config).float()


def _batch(model, rows: int = 64, seed: int = 0) -> dict:
    """On-policy samples of the tiny model after :data:`PROMPT`, rewarded when the first token is TARGET, with
    group-centred advantages (one group) and the sampler's own logprobs, as the TRL adapter lays them out."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.tensor([PROMPT] * rows)
    completion = torch.zeros(rows, 0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(REPLY):
            ids = torch.cat([prompt, completion], dim=1)
            probs = torch.softmax(model(ids).logits[:, -1].float(), dim=-1)
            completion = torch.cat([completion, torch.multinomial(probs, 1, generator=generator)], dim=1)
        ones = torch.ones_like(completion)
        behaviour = completion_logprobs(model, prompt, torch.ones_like(prompt), completion, ones)
    rewards = (completion[:, 0] == TARGET).float()
    return {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": ones,
        "advantages": rewards - rewards.mean(),
        "old_per_token_logps": behaviour,
    }


def _target_logprob(model) -> float:
    with torch.no_grad():
        return float(torch.log_softmax(model(torch.tensor([PROMPT])).logits[0, -1].float(), -1)[TARGET])


def _change(model, batch: dict, fault: str | None, steps: int = 3, lr: float = 0.05) -> float:
    """How the target's logprob at the first reply position moves over ``steps`` updates on ``batch``."""
    before = _target_logprob(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = grpo_loss(model, plant(batch, fault))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return _target_logprob(model) - before


def test_the_task_rewards_a_reply_that_starts_with_seven():
    assert [reward(t) for t in ["7", " 72", "17", "", "seven", "\n7"]] == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_a_clean_update_raises_the_rewarded_token_and_negated_advantages_lower_it():
    batch = _batch(_model())
    clean = _change(_model(), batch, None)
    negated = _change(_model(), batch, "advantages")
    assert clean > 0.05 and negated < -0.05


def test_a_loss_mask_off_by_one_leaves_the_rewarded_token_almost_untrained():
    batch = _batch(_model())
    clean = _change(_model(), batch, None)
    shifted = _change(_model(), batch, "mask")
    assert abs(shifted) < 0.25 * clean
    planted = plant(batch, "mask")
    assert (
        planted["completion_mask"][:, 0].sum() == 0 and loss_mask(planted).sum() == batch["completion_mask"].sum() - 64
    )


def test_behaviour_logprobs_off_by_one_stall_the_update_once_the_policy_prefers_the_target():
    model = _model()
    for seed in range(6):  # clean steps until the target is clearly preferred at the first position
        _change(model, _batch(model, seed=seed), None, steps=3, lr=0.2)
    assert _target_logprob(model) > -0.7
    batch = _batch(model, seed=99)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    clean = _change(model, batch, None)
    model.load_state_dict(state)
    shifted = _change(model, batch, "logprobs")
    assert clean > 0.01 and shifted < 0.25 * clean
    planted = plant(batch, "logprobs")["old_per_token_logps"]
    assert torch.equal(planted[:, 1:], batch["old_per_token_logps"][:, :-1])
    assert torch.equal(planted[:, 0], batch["old_per_token_logps"][:, -1])


def test_an_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown fault 'sign'"):
        plant({}, "sign")
    assert FAULTS == ("advantages", "logprobs", "mask")


@pytest.mark.parametrize("args", [["--rate", "0"], ["--iterations", "0"], ["--requests", "-1"], ["--fault", "sign"]])
def test_bad_loop_options_are_usage_errors_before_anything_starts(tmp_path, args):
    done = subprocess.run(
        [sys.executable, "-m", "loop", "--out", str(tmp_path / "out"), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "error" in done.stderr and not (tmp_path / "out").exists()


@pytest.mark.genuine
@pytest.mark.skipif(vllm_skip_reason() is not None, reason=str(vllm_skip_reason()))
def test_a_short_loop_advances_versions_counts_staleness_and_ships_nothing_twice(tmp_path):
    out = tmp_path / "loop_out"
    done = subprocess.run(
        [sys.executable, "-m", "loop", "--out", str(out), "--iterations", "3", "--requests", "6"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["iterations"] == 3 and result["samples_shipped"] > 0
    rows = [json.loads(line) for line in (out / "iterations.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == ["policy-v0", "policy-v1", "policy-v2"]
    assert all(r["fresh_samples"] >= 48 for r in rows)  # 6 calls of 8 replies each, answered by the current policy
    assert rows[0]["staleness"].keys() == {"0"}  # nothing older than policy-v0
    assert sum(r["staleness"].get("1", 0) for r in rows[1:]) > 0  # traffic went on while the trainer trained
    assert result["stale_dropped"] == sum(r["dropped"].get("stale", 0) for r in rows) > 0
    assert result["stale_dropped"] <= sum(int(n) for r in rows for age, n in r["staleness"].items() if age != "0")
    assert (out / "loop.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ids = _shipped_ids(Path(out / "shards"))
    assert len(ids) == len(set(ids)) == result["samples_shipped"]


def _shipped_ids(out: Path) -> list[str]:
    import pyarrow.parquet as pq

    return [
        i
        for part in sorted(out.rglob("*.parquet"))
        for i in pq.read_table(part, columns=["sample_id"])["sample_id"].to_pylist()
    ]
