"""Shard rows as a verl PPO batch: the tensor keys of ``DataProto.batch``, its non-tensor ``uid`` and its
``meta_info``.

The contract, read from verl's source at release 0.9.1 (volcengine/verl, package ``verl``):

- ``verl/experimental/agent_loop/agent_loop.py`` (the single-sample padding and ``_postprocess``): ``prompts``
  [B, P] left-padded, ``responses`` [B, R] right-padded, ``response_mask`` [B, R] (1 on LLM-generated tokens, 0 on
  tool tokens and padding), ``input_ids`` = prompts ‖ responses, ``attention_mask`` = prompt mask ‖ response mask
  [B, P + R], ``position_ids`` = ``compute_position_id_with_mask(attention_mask)`` (``clip(cumsum(mask) − 1, 0)``),
  ``rollout_log_probs`` [B, R] padded with 0.0.
- ``verl/trainer/ppo/ray_trainer.py`` (``_update_actor``): sets ``meta_info["temperature"]`` (from the rollout
  config), turns the batch into a TensorDict (``DataProto.to_tensordict``, meta_info as non-tensor data) and into
  the no-padding layout (``verl/workers/utils/padding.py``: ``left_right_2_no_padding``). The engine reads
  ``micro_batch["temperature"]`` to scale the logits before computing logprobs
  (``verl/workers/engine/fsdp/transformer_impl.py``: ``prepare_model_inputs``), so it must be there.
- ``verl/workers/utils/losses.py`` (``ppo_loss``): selects ``response_mask``, ``old_log_probs``, ``advantages``,
  ``rollout_is_weights`` when present and ``ref_log_prob`` with ``use_kl_loss``.
- ``verl/trainer/ppo/ray_trainer.py``: ``uid`` (the GRPO group) in ``non_tensor_batch``;
  ``verl/trainer/ppo/metric_utils.py``: ``token_level_scores``, ``token_level_rewards`` and ``returns`` feed its
  metrics (``compute_data_metrics``).

``old_log_probs`` are the behaviour logprobs as sampled (verl's bypass mode, where the rollout's logprobs stand
in for a recomputation); recompute them with the actor when the policy has moved on.

``meta_info["temperature"]`` is always set: the ``temperature`` the caller passes, else the rows' one recorded
temperature, else 1.0 with a :class:`TemperatureWarning` saying how many rows are unknown or which temperatures
are mixed. Not an error: verl itself puts one configured number there for the whole batch, whatever each sample
was drawn at, and most serving traces do not record the temperature, so refusing would leave such data
untrainable; the warning says what was assumed and how to state it (``temperature=``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prl.loaders.rows import Rows, pad_ragged


class TemperatureWarning(UserWarning):
    """The batch's sampling temperature is unknown or mixed; verl is told 1.0."""


def batch_temperature(rows: Rows) -> tuple[float, str | None]:
    """``(temperature, why not known)``: the rows' one recorded temperature and None, or 1.0 and the reason."""
    t_N = rows.temperature_N
    if t_N is None or not len(t_N):
        return 1.0, "the rows record no sampling temperature"
    unknown = int((~np.isfinite(t_N)).sum())
    if unknown:
        return 1.0, f"{unknown} of {len(t_N)} rows record no sampling temperature"
    distinct = np.unique(t_N)
    if len(distinct) > 1:
        shown = ", ".join(f"{float(t):g}" for t in distinct[:5]) + (", …" if len(distinct) > 5 else "")
        return 1.0, f"the rows were sampled at {len(distinct)} temperatures ({shown})"
    return float(str(distinct[0])), None  # the float32's shortest decimal: 0.7, not 0.699999988


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
    temperature: float | None = None,
) -> VerlBatch:
    """verl's batch keys for ``rows`` (see the module docstring). ``prompt_length`` / ``response_length``
    default to the longest prompt / completion of the rows. ``as_torch`` makes torch tensors (torch must be
    installed); otherwise numpy arrays of the same dtypes (int64 ids and masks, float32 values).
    ``temperature``: what ``meta_info["temperature"]`` says (default: the rows' own, see the module docstring)."""
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
    if temperature is None:
        temperature, unknown = batch_temperature(rows)
        if unknown is not None:
            warnings.warn(
                f"{unknown}: verl's meta_info temperature is 1.0; pass temperature= to state it",
                TemperatureWarning,
                stacklevel=2,
            )
    meta: dict[str, Any] = {"pad_token_id": pad_id, "temperature": float(temperature)}
    if as_torch:
        import torch

        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
    non_tensors = {
        "uid": np.asarray(rows.group_id_N, dtype=object),
        "sample_id": np.asarray(rows.sample_id_N, dtype=object),
    }
    return VerlBatch(tensors, non_tensors, meta)
