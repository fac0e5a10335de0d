"""Shard rows as a verl PPO batch: the tensor keys of ``DataProto.batch`` and the ``uid`` of its non-tensor batch.

The contract, read from verl's source (volcengine/verl at b178a3cd56f58b2d502255daba591e92833930a7):

- ``verl/experimental/agent_loop/agent_loop.py`` (``AgentLoopWorker._postprocess`` and the single-sample padding
  before it): ``prompts`` [B, P] left-padded, ``responses`` [B, R] right-padded, ``response_mask`` [B, R] (1 on
  LLM-generated tokens, 0 on tool tokens and padding), ``input_ids`` = prompts ‖ responses, ``attention_mask``
  = prompt mask ‖ response mask [B, P + R], ``position_ids`` = ``compute_position_id_with_mask(attention_mask)``
  (``clip(cumsum(mask) − 1, 0)``), ``rollout_log_probs`` [B, R] padded with 0.0.
- ``verl/workers/actor/dp_actor.py`` (``DataParallelPPOActor.update_policy``): selects ``responses``,
  ``response_mask``, ``input_ids``, ``attention_mask``, ``position_ids``, ``old_log_probs``, ``advantages``, and
  ``ref_log_prob`` with ``use_kl_loss``; reads ``data.meta_info["temperature"]``.
- ``verl/trainer/ppo/ray_trainer.py``: ``uid`` (the GRPO group) in ``non_tensor_batch``; ``token_level_scores``,
  ``token_level_rewards`` and ``returns`` feed its metrics (``compute_data_metrics``).

``old_log_probs`` are the behaviour logprobs as sampled (verl's bypass mode, where the rollout's logprobs stand
in for a recomputation); recompute them with the actor when the policy has moved on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prl.loaders.rows import Rows, pad_ragged


@dataclass
class VerlBatch:
    """What ``DataProto.from_dict(tensors=…, non_tensors=…, meta_info=…)`` takes."""

    tensors: dict[str, Any]
    non_tensors: dict[str, np.ndarray]
    meta_info: dict[str, Any] = field(default_factory=dict)


def _prompt_and_response(rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Flat prompt tokens with offsets, flat completion tokens with offsets."""
    seq_start = rows.seq_off_N1[:-1]
    row_T = np.repeat(np.arange(rows.num_rows), rows.seq_len_N)
    pos_T = np.arange(len(row_T)) - seq_start[row_T]
    in_prompt = pos_T < rows.prompt_len_N[row_T]
    prompt_off = np.concatenate(([0], np.cumsum(rows.prompt_len_N)))
    return rows.input_ids_T[in_prompt], prompt_off, rows.input_ids_T[~in_prompt], rows.comp_off_N1


def to_verl(
    rows: Rows,
    prompt_length: int | None = None,
    response_length: int | None = None,
    pad_id: int = 0,
    as_torch: bool = False,
) -> VerlBatch:
    """verl's batch keys for ``rows`` (see the module docstring). ``prompt_length`` / ``response_length``
    default to the longest prompt / completion of the rows. ``as_torch`` makes torch tensors (torch must be
    installed); otherwise numpy arrays of the same dtypes (int64 ids and masks, float32 values)."""
    prompt_T, prompt_off, resp_T, resp_off = _prompt_and_response(rows)
    prompts = pad_ragged(prompt_T, prompt_off, prompt_length, pad_id, left=True)
    responses = pad_ragged(resp_T, resp_off, response_length, pad_id)
    ones_P = np.ones(len(prompt_T), dtype=np.int64)
    ones_R = np.ones(len(resp_T), dtype=np.int64)
    prompt_mask = pad_ragged(ones_P, prompt_off, prompts.shape[1], 0, left=True)
    response_attn = pad_ragged(ones_R, resp_off, responses.shape[1], 0)
    attention_mask = np.concatenate([prompt_mask, response_attn], axis=1)
    width = responses.shape[1]
    response_mask = pad_ragged(rows.loss_mask_C.astype(np.int64), resp_off, width, 0)
    logprobs = pad_ragged(rows.behavior_logprobs_C, resp_off, width, 0.0)
    advantages = pad_ragged(rows.token_advantages_C, resp_off, width, 0.0)
    scores = np.zeros(responses.shape, dtype=np.float32)
    last = rows.comp_len_N - 1
    has = last >= 0
    scores[np.nonzero(has)[0], last[has]] = rows.reward_N[has]
    tensors: dict[str, Any] = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention_mask,
        "position_ids": np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None),
        "response_mask": response_mask,
        "old_log_probs": logprobs,
        "rollout_log_probs": logprobs.copy(),
        "advantages": advantages,
        "returns": advantages.copy(),
        "token_level_scores": scores,
        "token_level_rewards": scores.copy(),
    }
    if rows.ref_logprobs_C is not None:
        tensors["ref_log_prob"] = pad_ragged(rows.ref_logprobs_C, resp_off, width, 0.0)
    meta: dict[str, Any] = {"pad_token_id": pad_id}
    if rows.temperature_N is not None:
        t_N = rows.temperature_N
        if len(t_N) and np.isfinite(t_N).all() and (t_N == t_N[0]).all():  # one known temperature: verl's meta
            meta["temperature"] = float(t_N[0])
    if as_torch:
        import torch

        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
    non_tensors = {
        "uid": np.asarray(rows.group_id_N, dtype=object),
        "sample_id": np.asarray(rows.sample_id_N, dtype=object),
    }
    return VerlBatch(tensors, non_tensors, meta)
