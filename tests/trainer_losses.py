"""The trainers' own loss code run on the adapters' batches, and the recorded values it gave.

- :func:`trl_loss`: TRL's ``GRPOTrainer._compute_loss`` itself (the method, unchanged) on a trainer object that
  has only what that method reads, set from a real ``GRPOConfig``; the model's forward pass is replaced by the
  policy logprobs the test gives, so the loss depends only on the batch and those logprobs.
- :func:`verl_loss`: verl's ``ppo_loss`` (``verl/workers/utils/losses.py``) on the adapter's batch taken through
  verl's own ``DataProto.from_dict`` → ``to_tensordict`` → ``left_right_2_no_padding``, as ``_update_actor`` does.

Both need the trainers' virtualenv (``make trainers-venv``). ``python -m tests.trainer_losses`` (in that virtualenv,
from the repository root) writes ``tests/fixtures/trainers/recorded.json``: the batches, the policy logprobs and
the losses the trainers computed, which the ordinary suite checks the adapters and the documented formulas
against where the trainers are not installed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDED = os.path.join(HERE, "fixtures", "trainers", "recorded.json")


def sample_rows():
    """Three rows of two groups: a tool span outside the loss mask, a null behaviour logprob, reference logprobs,
    KL folded into the token advantages, known temperatures."""
    from prl.loaders import Rows
    from prl.schema import SHARD
    from tests.test_loaders import shard_row

    rows = [
        shard_row(
            "a",
            "g1",
            [5, 6, 7],
            [10, 11, 12, 13],
            loss_mask=[True, False, False, True],
            behavior_logprobs=[-0.25, -1.5, -2.0, -0.75],
            ref_logprobs=[-0.5, -1.0, -1.0, -0.5],
            token_advantages=[0.75, 0.0, 0.0, 1.25],
            advantage=1.0,
            temperature=0.7,
        ),
        shard_row(
            "b",
            "g1",
            [5, 6, 7],
            [20, 21],
            behavior_logprobs=[None, -0.125],
            ref_logprobs=[-0.25, -0.25],
            token_advantages=[-1.0, -0.875],
            advantage=-1.0,
            temperature=0.7,
        ),
        shard_row(
            "c",
            "g2",
            [8],
            [30, 31, 32],
            behavior_logprobs=[-3.0, -0.0625, -1.0],
            ref_logprobs=[-2.0, -0.125, -1.5],
            token_advantages=[0.5, 0.625, 0.25],
            advantage=0.5,
            temperature=0.7,
        ),
    ]
    return Rows.from_arrow(pa.Table.from_pylist(rows, schema=SHARD))


def policy_logps(shape: tuple[int, int], behaviour: np.ndarray) -> np.ndarray:
    """The 'model's' logprobs of the completion tokens: the behaviour ones moved by fixed amounts, some far enough
    for PPO's clip and the importance-sampling bounds to act."""
    shift = np.array([0.05, -0.3, 0.4, 1.5, -2.0, 0.02, -0.1], dtype=np.float32)
    flat = np.resize(shift, shape[0] * shape[1]).reshape(shape)
    return (behaviour + flat).astype(np.float32)


class _Accelerator:
    """What ``_compute_loss`` asks of accelerate's ``Accelerator``: the process count and collectives (here one
    process holding the values; ``num_processes`` is what the test states)."""

    def __init__(self, num_processes: int) -> None:
        self.num_processes = num_processes
        self.sync_gradients = True

    def gather(self, t):
        return t.reshape(-1) if t.dim() == 0 else t

    gather_for_metrics = gather

    def reduce(self, t, reduction="sum"):
        return t


def trl_loss(inputs: dict[str, Any], policy: np.ndarray, num_processes: int = 1, **config: Any) -> Any:
    """TRL's ``_compute_loss`` on ``inputs`` (torch tensors from ``to_trl_grpo(as_torch=True)``), the model's
    completion logprobs being ``policy``. ``config``: ``GRPOConfig`` fields (``use_vllm`` included)."""
    import torch
    from trl import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to=[], **config)
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    trainer.args = args
    for name in (
        "loss_type",
        "beta",
        "use_vllm",
        "vllm_importance_sampling_correction",
        "importance_sampling_level",
        "off_policy_mask_threshold",
        "top_entropy_quantile",
        "max_completion_length",
    ):
        setattr(trainer, name, getattr(args, name))
    trainer.epsilon_low = args.epsilon
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    trainer.aux_loss_enabled = False
    trainer._entropy_bonus_enabled = False
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.accelerator = _Accelerator(num_processes)
    trainer.current_gradient_accumulation_steps = 1
    model = torch.nn.Linear(1, 1)
    model.train()
    trainer.model = model
    logps = torch.from_numpy(policy)

    def forward(model, input_ids, attention_mask, logits_to_keep, **_: Any):
        assert logits_to_keep == logps.shape[1]
        return logps, torch.zeros_like(logps), None

    trainer._get_per_token_logps_and_entropies = forward
    return GRPOTrainer._compute_loss(trainer, model, inputs)


def verl_loss(batch: Any, policy: np.ndarray, **actor: Any) -> tuple[Any, Any]:
    """verl's ``ppo_loss`` on ``batch`` (a :class:`prl.loaders.VerlBatch` with torch tensors), the actor's
    response logprobs being ``policy`` [B, R]; ``actor``: ``ActorConfig`` fields. Returns ``(loss, the
    TensorDict the engine would read)``."""
    import torch
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    data = DataProto.from_dict(tensors=batch.tensors, non_tensors=batch.non_tensors, meta_info=batch.meta_info)
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor_data(td, "dp_size", 1)
    tu.assign_non_tensor_data(td, "batch_num_tokens", None)
    tu.assign_non_tensor_data(td, "global_batch_size", None)
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **actor)
    # the engine's output: one logprob per sequence position, the one at t scoring token t + 1
    attention = batch.tensors["attention_mask"]
    width = batch.tensors["prompts"].shape[1]
    per_row = []
    for i in range(attention.shape[0]):
        p, r = int(attention[i, :width].sum()), int(attention[i, width:].sum())
        per_row.append(torch.cat([torch.zeros(p - 1), torch.from_numpy(policy[i, :r]), torch.zeros(1)]))
    log_probs = torch.nested.as_nested_tensor(per_row, layout=torch.jagged)
    loss, _ = ppo_loss(config, {"log_probs": log_probs}, td)
    return loss, td


def record() -> dict[str, Any]:
    """Run the trainers' losses on the sample batch and return what to record."""
    import torch
    import trl
    import verl

    from prl.loaders import to_trl_grpo, to_verl

    rows = sample_rows()
    out: dict[str, Any] = {
        "command": "make trainers-venv && /work/venvs/trainers/bin/python -m tests.trainer_losses",
        "trl": trl.__version__,
        "verl": verl.__version__,
        "torch": torch.__version__,
        "trl_cases": [],
    }
    plain = to_trl_grpo(rows)
    policy = policy_logps(plain["completion_ids"].shape, plain["sampling_per_token_logps"])
    recomputed = policy_logps(plain["completion_ids"].shape, plain["sampling_per_token_logps"] + 0.5)
    out["policy_logps"] = policy.tolist()
    out["recomputed_logps"] = recomputed.tolist()
    for case in TRL_CASES:
        kw = dict(case["adapter"])
        if kw.pop("recomputed", False):
            kw["old_per_token_logps"] = recomputed
        inputs = to_trl_grpo(rows, as_torch=True, **kw)
        loss = trl_loss(inputs, policy, num_processes=case["num_processes"], **case["config"])
        with tempfile.TemporaryDirectory() as tmp:
            args = trl.GRPOConfig(output_dir=tmp, use_cpu=True, bf16=False, report_to=[], **case["config"])
        out["trl_cases"].append(
            {
                **case,
                "epsilon": args.epsilon,
                "epsilon_high": args.epsilon_high if args.epsilon_high is not None else args.epsilon,
                "inputs": {k: v.tolist() for k, v in inputs.items()},
                "loss": float(loss),
                "loss_shape": list(loss.shape),
            }
        )
    batch = to_verl(rows, as_torch=True)
    vpolicy = policy_logps(tuple(batch.tensors["responses"].shape), batch.tensors["old_log_probs"].numpy())
    out["verl_policy_logps"] = vpolicy.tolist()
    out["verl_cases"] = []
    for case in VERL_CASES:
        loss, td = verl_loss(batch, vpolicy, **case["actor"])
        out["verl_cases"].append(
            {**case, "loss": float(loss), "temperature": float(td["temperature"]), "meta_info": batch.meta_info}
        )
    out["verl_tensors"] = {k: v.tolist() for k, v in batch.tensors.items()}
    return out


TRL_CASES: list[dict[str, Any]] = [
    {"adapter": {}, "config": {"loss_type": "dapo", "use_vllm": True}, "num_processes": 1},
    {
        "adapter": {"num_items_in_batch": 12, "world_size": 2},
        "config": {"loss_type": "dapo", "use_vllm": True},
        "num_processes": 2,
    },
    {
        "adapter": {"recomputed": True},
        "config": {"loss_type": "dapo", "use_vllm": True},
        "num_processes": 1,
    },
    {
        "adapter": {"recomputed": True, "importance_sampling_mode": "token_truncate"},
        "config": {
            "loss_type": "grpo",
            "use_vllm": True,
            "vllm_importance_sampling_mode": "token_truncate",
            "beta": 0.04,
        },
        "num_processes": 1,
    },
    {"adapter": {"token_advantages": False}, "config": {"loss_type": "bnpo", "use_vllm": False}, "num_processes": 1},
]
"""Adapter arguments and GRPOConfig fields of each recorded TRL loss."""

VERL_CASES: list[dict[str, Any]] = [
    {"actor": {"loss_agg_mode": "token-mean"}},
    {"actor": {"loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": True, "kl_loss_coef": 0.1}},
]
"""ActorConfig fields of each recorded verl loss."""


if __name__ == "__main__":
    recorded = record()
    os.makedirs(os.path.dirname(RECORDED), exist_ok=True)
    with open(RECORDED, "w") as f:
        json.dump(recorded, f, indent=1)
        f.write("\n")
    print(f"wrote {RECORDED}", file=sys.stderr)
