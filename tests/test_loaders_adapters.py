"""Framework adapters: exact keys, shapes and values, checked against each framework's own types where they install.

- Tinker: the real SDK (``tinker.types.Datum``, ``ModelInput``, ``TensorData``).
- prime-rl (not installable here): ``TrainingSample`` as a msgspec struct with the fields of
  PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64 ``src/prime_rl/transports/rollouts/types.py``;
  its constructor refuses unknown fields and its msgpack decoder checks types.
- verl and TRL (not installable here): the key sets and layouts their source reads (cited in
  :mod:`prl.loaders.verl` and :mod:`prl.loaders.trl`), and torch tensors of the dtypes they compute with.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from prl.loaders import Rows, to_prime_rl, to_tinker, to_trl_grpo, to_verl
from prl.schema import SHARD
from tests.test_loaders import shard_row, two_rows

SAMPLED = SHARD if "temperature" in SHARD.names else SHARD.append(pa.field("temperature", pa.float32()))


def with_ref() -> Rows:
    return Rows.from_arrow(
        pa.Table.from_pylist(
            [
                shard_row("a", "g1", [1, 2], [10, 11], ref_logprobs=[-0.75, -1.0], kl=[0.0, 0.5]),
                shard_row("b", "g2", [3, 4, 5], [20], ref_logprobs=[-2.0], kl=[1.0], temperature=0.5),
            ],
            schema=SAMPLED,
        )
    )


def test_verl_batch_keys_layout_and_values():
    batch = to_verl(two_rows(), pad_id=9)
    t = batch.tensors
    assert set(t) == {
        "prompts",
        "responses",
        "input_ids",
        "attention_mask",
        "position_ids",
        "response_mask",
        "old_log_probs",
        "rollout_log_probs",
        "advantages",
        "returns",
        "token_level_scores",
        "token_level_rewards",
    }
    assert t["prompts"].tolist() == [[1, 2], [9, 3]]  # left-padded
    assert t["responses"].tolist() == [[10, 11, 12], [20, 21, 9]]  # right-padded
    assert t["input_ids"].tolist() == [[1, 2, 10, 11, 12], [9, 3, 20, 21, 9]]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 0]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 2, 2]]
    assert t["response_mask"].tolist() == [[1, 0, 1], [0, 1, 0]]
    assert t["old_log_probs"].tolist() == [[-0.5, -0.5, -0.5], [0.0, -0.25, 0.0]]
    assert t["advantages"].tolist() == [[1, 1, 1], [-1, -1, 0]]
    assert t["token_level_scores"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert batch.non_tensors["uid"].tolist() == ["g", "g"]
    assert batch.non_tensors["sample_id"].tolist() == ["a", "b"]
    assert batch.meta_info == {"pad_token_id": 9}
    fixed = to_verl(two_rows(), prompt_length=4, response_length=5)
    assert fixed.tensors["prompts"].shape == (2, 4) and fixed.tensors["responses"].shape == (2, 5)


def test_verl_ref_and_temperature():
    batch = to_verl(with_ref())
    assert batch.tensors["ref_log_prob"].tolist() == [[-0.75, -1.0], [-2.0, 0.0]]
    assert "temperature" not in batch.meta_info  # one row's temperature is unknown
    rows = with_ref()
    rows.temperature_N = np.array([0.5, 0.5], dtype=np.float32)
    assert to_verl(rows).meta_info["temperature"] == 0.5


def test_verl_as_torch_dtypes():
    torch = pytest.importorskip("torch")
    t = to_verl(two_rows(), as_torch=True).tensors
    assert t["input_ids"].dtype == torch.int64 and t["attention_mask"].dtype == torch.int64
    assert t["old_log_probs"].dtype == torch.float32 and t["advantages"].dtype == torch.float32
    assert t["position_ids"].dtype == torch.int64


def test_trl_grpo_fields():
    out = to_trl_grpo(two_rows(), pad_id=0)
    assert out["prompt_ids"].tolist() == [[1, 2], [0, 3]]
    assert out["prompt_mask"].tolist() == [[1, 1], [0, 1]]
    assert out["completion_ids"].tolist() == [[10, 11, 12], [20, 21, 0]]
    assert out["completion_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["tool_mask"].tolist() == [[1, 0, 1], [0, 1, 0]]
    assert out["advantages"].tolist() == [1.0, -1.0] and out["advantages"].dtype == np.float32
    assert out["old_per_token_logps"].tolist() == [[-0.5, -0.5, -0.5], [0.0, -0.25, 0.0]]
    assert out["sampling_per_token_logps"].tolist() == out["old_per_token_logps"].tolist()
    assert int(out["num_items_in_batch"]) == 3
    assert "ref_per_token_logps" not in out
    tokens = to_trl_grpo(two_rows(), token_advantages=True)
    assert tokens["advantages"].tolist() == [[1, 1, 1], [-1, -1, 0]]
    full = to_trl_grpo(with_ref())
    assert "tool_mask" not in full and full["ref_per_token_logps"].tolist() == [[-0.75, -1.0], [-2.0, 0.0]]


def test_trl_as_torch():
    torch = pytest.importorskip("torch")
    out = to_trl_grpo(two_rows(), as_torch=True)
    assert out["completion_ids"].dtype == torch.int64 and out["advantages"].shape == (2,)
    assert out["num_items_in_batch"].item() == 3


def test_prime_rl_training_samples_convert_to_the_struct():
    msgspec = pytest.importorskip("msgspec")

    class TrainingSample(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
        """Fields and types of prime-rl's TrainingSample (source cited in the module docstring)."""

        token_ids: list[int]
        mask: list[bool]
        logprobs: list[float]
        temperatures: list[float]
        env_name: str
        ref_logprobs: list[float] | None = None
        mm_kwargs: dict | None = None
        routed_experts: dict | None = None
        mm_token_type_ids: list[int] | None = None
        rl_weights: list[float] | None = None
        ce_weights: list[float] | None = None
        ref_kl_weights: list[float] | None = None
        advantages: list[float] | None = None

    records = to_prime_rl(with_ref(), env_name="math")
    # the struct's constructor refuses unknown fields; its msgpack decoder checks every type
    samples = [
        msgspec.msgpack.decode(msgspec.msgpack.encode(TrainingSample(**r)), type=TrainingSample) for r in records
    ]
    a, b = samples
    assert a.token_ids == [1, 2, 10, 11] and a.mask == [False, False, True, True]
    assert a.logprobs == [0.0, 0.0, -0.5, -0.5] and a.advantages == [0.0, 0.0, 1.0, 1.0]
    assert a.ref_logprobs == [0.0, 0.0, -0.75, -1.0] and a.temperatures == [1.0] * 4  # unknown → 1.0
    assert b.temperatures == [0.5] * 4 and b.env_name == "math"
    for s in samples:
        n = len(s.token_ids)
        assert len(s.mask) == len(s.logprobs) == len(s.temperatures) == len(s.advantages) == n
    assert samples[0] == TrainingSample(**records[0])
    plain = to_prime_rl(two_rows())
    assert "ref_logprobs" not in plain[0] and plain[1]["mask"] == [False, False, True]


def test_tinker_datums_are_sdk_objects():
    tinker = pytest.importorskip("tinker")
    types = tinker.types
    datums = to_tinker(two_rows(), with_mask=True)
    assert len(datums) == 2 and all(isinstance(d, types.Datum) for d in datums)
    a, b = datums
    assert isinstance(a.model_input, types.ModelInput) and a.model_input.to_ints() == [1, 2, 10, 11]
    inputs = {k: v.to_numpy().tolist() for k, v in a.loss_fn_inputs.items()}
    assert inputs == {
        "target_tokens": [2, 10, 11, 12],
        "logprobs": [0.0, -0.5, -0.5, -0.5],
        "advantages": [0.0, 1.0, 0.0, 1.0],  # outside the loss mask: 0
        "mask": [0.0, 1.0, 0.0, 1.0],
    }
    assert a.loss_fn_inputs["target_tokens"].dtype == "int64" and a.loss_fn_inputs["logprobs"].dtype == "float32"
    assert b.model_input.to_ints() == [3, 20]
    assert b.loss_fn_inputs["logprobs"].to_numpy().tolist() == [0.0, -0.25]
    assert b.loss_fn_inputs["advantages"].to_numpy().tolist() == [0.0, -1.0]  # null logprob: out of the loss
    assert set(to_tinker(two_rows())[0].loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}


def test_tinker_skips_rows_without_a_target():
    pytest.importorskip("tinker")
    rows = Rows.from_arrow(
        pa.Table.from_pylist([shard_row("a", "g", [], [5]), shard_row("b", "g", [], [6, 7])], schema=SHARD)
    )
    datums = to_tinker(rows)
    assert len(datums) == 1 and datums[0].model_input.to_ints() == [6]
    assert datums[0].loss_fn_inputs["logprobs"].to_numpy().tolist() == [-0.5]
