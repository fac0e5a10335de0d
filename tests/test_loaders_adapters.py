"""Framework adapters: exact keys, shapes and values, checked against each framework's own types where they install.

- Tinker: the real SDK (``tinker.types.Datum``, ``ModelInput``, ``TensorData``).
- prime-rl (not installable here): ``TrainingSample`` as a msgspec struct with the fields of
  PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64 ``src/prime_rl/transports/rollouts/types.py``;
  its constructor refuses unknown fields and its msgpack decoder checks types.
- verl and TRL: the key sets and layouts their source reads (cited in :mod:`prl.loaders.verl` and
  :mod:`prl.loaders.trl`) and torch tensors of the dtypes they compute with; their own loss code on the adapters'
  batches is in ``tests/test_loaders_trainers.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest

from prl.errors import UsageError
from prl.loaders import (
    Rows,
    TemperatureWarning,
    importance_sampling_ratio,
    to_prime_rl,
    to_tinker,
    to_trl_grpo,
    to_verl,
)
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
    batch = to_verl(two_rows(), pad_id=9, temperature=0.6)
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
    assert batch.meta_info == {"pad_token_id": 9, "temperature": 0.6}
    fixed = to_verl(two_rows(), prompt_length=4, response_length=5, temperature=1.0)
    assert fixed.tensors["prompts"].shape == (2, 4) and fixed.tensors["responses"].shape == (2, 5)


def test_verl_ref_and_temperature():
    with pytest.warns(TemperatureWarning, match=r"^1 of 2 rows record no sampling temperature: verl's meta_info"):
        batch = to_verl(with_ref())
    assert batch.tensors["ref_log_prob"].tolist() == [[-0.75, -1.0], [-2.0, 0.0]]
    assert batch.meta_info["temperature"] == 1.0  # one row's temperature is unknown
    rows = with_ref()
    rows.temperature_N = np.array([0.5, 0.5], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert to_verl(rows).meta_info["temperature"] == 0.5  # one known temperature: no warning
        assert to_verl(with_ref(), temperature=0.9).meta_info["temperature"] == 0.9  # stated: no warning
    rows.temperature_N = np.array([0.5, 0.75], dtype=np.float32)
    with pytest.warns(TemperatureWarning, match=r"sampled at 2 temperatures \(0\.5, 0\.75\)"):
        assert to_verl(rows).meta_info["temperature"] == 1.0
    rows.temperature_N = None
    with pytest.warns(TemperatureWarning, match="the rows record no sampling temperature"):
        assert to_verl(rows).meta_info["temperature"] == 1.0


def test_verl_as_torch_dtypes():
    torch = pytest.importorskip("torch")
    t = to_verl(two_rows(), as_torch=True, temperature=1.0).tensors
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
    # every loss-mask token's advantage is its row's: the per-row advantages, TRL's own shape
    assert out["advantages"].tolist() == [1.0, -1.0] and out["advantages"].dtype == np.float32
    assert out["old_per_token_logps"].tolist() == [[-0.5, -0.5, -0.5], [0.0, -0.25, 0.0]]
    assert out["sampling_per_token_logps"].tolist() == out["old_per_token_logps"].tolist()
    assert out["num_items_in_batch"].shape == () and out["num_items_in_batch"].dtype == np.int64
    assert int(out["num_items_in_batch"]) == 3
    assert out["importance_sampling_ratio"].tolist() == [[1.0], [1.0]]  # sequence_mask, equal logprobs
    assert "ref_per_token_logps" not in out
    tokens = to_trl_grpo(two_rows(), token_advantages=True)
    assert tokens["advantages"].tolist() == [[1, 1, 1], [-1, -1, 0]]
    full = to_trl_grpo(with_ref())
    assert "tool_mask" not in full and full["ref_per_token_logps"].tolist() == [[-0.75, -1.0], [-2.0, 0.0]]


def test_trl_token_advantages_by_default_when_kl_is_in_them():
    rows = with_ref()
    rows.token_advantages_C = np.array([0.75, 1.25, -1.0], dtype=np.float32)  # KL moved row a's tokens
    out = to_trl_grpo(rows)
    assert out["advantages"].tolist() == [[0.75, 1.25], [-1.0, 0.0]]
    assert to_trl_grpo(rows, token_advantages=False)["advantages"].tolist() == [1.0, 1.0]


def test_trl_num_items_in_batch_is_global_across_processes():
    assert int(to_trl_grpo(two_rows(), num_items_in_batch=11, world_size=4)["num_items_in_batch"]) == 11
    with pytest.raises(UsageError, match=r"with world_size=2, pass num_items_in_batch.*this one has 3"):
        to_trl_grpo(two_rows(), world_size=2)
    with pytest.raises(UsageError, match="num_items_in_batch=2 is below this process's own 3"):
        to_trl_grpo(two_rows(), num_items_in_batch=2)


def test_trl_importance_sampling_ratio_from_recomputed_logprobs():
    old = np.array([[-0.5, -9.0, 0.5], [-7.0, 0.75, 3.0]], dtype=np.float32)  # the trainer's recomputation
    out = to_trl_grpo(two_rows(), old_per_token_logps=old, importance_sampling_mode="token_truncate")
    assert out["old_per_token_logps"].tolist() == old.tolist()
    assert out["sampling_per_token_logps"].tolist() == [[-0.5, -0.5, -0.5], [0.0, -0.25, 0.0]]
    # exp((old − sampling) · mask), clipped to at most 3; masked positions give exp(0) = 1
    expected = np.exp(np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype=np.float32))
    assert out["importance_sampling_ratio"].tolist() == np.minimum(expected, 3.0).tolist()
    seq = to_trl_grpo(two_rows(), old_per_token_logps=old)["importance_sampling_ratio"]
    assert seq.shape == (2, 1) and seq.tolist() == [[np.exp(np.float32(1.0))]] * 2  # e < 3: kept
    wide = to_trl_grpo(two_rows(), old_per_token_logps=old, importance_sampling_clip_max=2.5)
    assert wide["importance_sampling_ratio"].tolist() == [[0.0], [0.0]]  # sequence_mask: e > 2.5 masks the row
    ratio = importance_sampling_ratio(
        np.array([[1.0, -1.0]]), np.array([[0.0, 0.0]]), np.array([[1, 1]]), "token_mask", clip_min=0.5, clip_max=2.0
    )
    assert ratio.tolist() == [[0.0, 0.0]]  # e > 2 and 1/e < 0.5
    with pytest.raises(UsageError, match="shape"):
        to_trl_grpo(two_rows(), old_per_token_logps=old[:, :2])
    with pytest.raises(UsageError, match="unknown importance sampling mode"):
        to_trl_grpo(two_rows(), importance_sampling_mode="token")  # type: ignore[arg-type]


def test_trl_as_torch():
    torch = pytest.importorskip("torch")
    out = to_trl_grpo(two_rows(), as_torch=True)
    assert out["completion_ids"].dtype == torch.int64 and out["advantages"].shape == (2,)
    assert out["num_items_in_batch"].shape == () and out["num_items_in_batch"].dtype == torch.int64
    assert out["num_items_in_batch"].item() == 3
    assert out["importance_sampling_ratio"].dtype == torch.float32


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
