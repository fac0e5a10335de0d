"""Shard rows as the inputs TRL's ``GRPOTrainer`` computes its loss from.

The contract, read from TRL's source at release 1.16.0 (huggingface/trl, ``trl/trainer/grpo_trainer.py``;
the defaults from ``trl/trainer/grpo_config.py``):

- ``_generate_and_score_completions`` returns ``prompt_ids`` / ``prompt_mask`` [B, P] left-padded,
  ``completion_ids`` / ``completion_mask`` [B, C] right-padded, ``advantages`` [B] (``_compute_loss`` also takes
  [B, C] and then uses it per token), multi-turn rows ``tool_mask`` [B, C] (the loss mask is
  ``completion_mask * tool_mask``), and when known ``old_per_token_logps``, ``sampling_per_token_logps`` (the
  inference engine's logprobs) and ``ref_per_token_logps`` [B, C].
- ``num_items_in_batch`` is a 0-d int64 tensor: the loss-mask tokens of the whole generation batch *gathered over
  every process* (``accelerator.gather(loss_mask.sum()).sum()``); the ``dapo`` / ``cispo`` / ``vespo`` losses
  divide by it over ``num_processes``.
- With ``use_vllm`` and ``vllm_importance_sampling_correction`` (on by default), ``old_per_token_logps`` are the
  trainer's own logprobs recomputed before the update, and ``importance_sampling_ratio`` is
  ``exp((old − sampling) · mask)`` per token (``token_*`` modes, [B, C]) or of its per-row sum (``sequence_*``
  modes, [B, 1]), NaN differences taken as 0, then clamped to ``[clip_min, clip_max]`` (``*_truncate``) or set to
  0 outside it (``*_mask``). Defaults: ``sequence_mask``, ``clip_max`` 3.0, no ``clip_min``. ``_compute_loss``
  multiplies the per-token loss by it (``inputs["importance_sampling_ratio"]``, so the key must be there).

What :func:`to_trl_grpo` gives: ``completion_mask`` is 1 on every completion token, ``tool_mask`` the shard's
``loss_mask`` (only when some token is outside it), ``sampling_per_token_logps`` the behaviour logprobs.
``old_per_token_logps`` are the trainer's recomputed logprobs when the caller passes them (and the importance
sampling ratio is computed from them as TRL does); without them they are the behaviour logprobs themselves, the
PPO ratio then corrects for the sampler directly, and the importance sampling ratio is what TRL's formula gives
for equal logprobs (1 on every token unless the clip range excludes 1).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from prl.errors import UsageError
from prl.loaders.rows import Rows, pad_ragged
from prl.loaders.verl import _prompt_and_response

ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def importance_sampling_ratio(
    old_per_token_logps: np.ndarray,
    sampling_per_token_logps: np.ndarray,
    mask: np.ndarray,
    mode: ImportanceSamplingMode = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> np.ndarray:
    """TRL's vLLM importance sampling ratio (see the module docstring), float32: [B, C] for ``token_*`` modes,
    [B, 1] for ``sequence_*`` modes."""
    if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        raise UsageError(
            f"unknown importance sampling mode {mode!r}: token_truncate, token_mask, sequence_truncate or sequence_mask"
        )
    if clip_min is None and clip_max is None:
        raise UsageError("give at least one of clip_min and clip_max")
    old = np.asarray(old_per_token_logps, dtype=np.float32)
    diff = np.nan_to_num((old - np.asarray(sampling_per_token_logps, np.float32)) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(axis=-1, keepdims=True, dtype=np.float32)
    ratio = np.exp(diff, dtype=np.float32)
    if mode.endswith("truncate"):
        return np.clip(ratio, clip_min, clip_max).astype(np.float32)
    low = -np.inf if clip_min is None else clip_min
    high = np.inf if clip_max is None else clip_max
    return np.where((ratio < low) | (ratio > high), np.float32(0.0), ratio).astype(np.float32)


def _advantages_are_per_row(rows: Rows) -> bool:
    """Whether every loss-mask token's advantage is its row's advantage (nothing, such as KL, went into them)."""
    row_C = np.repeat(np.arange(rows.num_rows), rows.comp_len_N)
    per_row = rows.advantage_N.astype(np.float32)[row_C]
    return bool(np.array_equal(rows.token_advantages_C[rows.loss_mask_C], per_row[rows.loss_mask_C]))


def to_trl_grpo(
    rows: Rows,
    pad_id: int = 0,
    token_advantages: bool | None = None,
    as_torch: bool = False,
    *,
    num_items_in_batch: int | None = None,
    world_size: int = 1,
    old_per_token_logps: Any = None,
    importance_sampling_mode: ImportanceSamplingMode = "sequence_mask",
    importance_sampling_clip_min: float | None = None,
    importance_sampling_clip_max: float | None = 3.0,
) -> dict[str, Any]:
    """TRL GRPO's batch for ``rows`` (see the module docstring).

    ``advantages``: with ``token_advantages`` None (the default), the shard's per-token advantages [B, C] whenever
    some loss-mask token's differs from its row's advantage (KL went into them), otherwise the per-row advantage
    [B] (the same loss); True / False force one or the other.

    ``num_items_in_batch``: the loss-mask tokens of the whole batch over all ``world_size`` processes, as TRL
    gathers it (e.g. ``torch.distributed.all_reduce`` of ``int(rows.loss_mask_C.sum())``); with one process it
    defaults to this batch's count, with more it must be given.

    ``old_per_token_logps``: the trainer's logprobs of the completion tokens [B, C] (numpy or torch), recomputed
    before the update as TRL does under vLLM; ``importance_sampling_ratio`` then comes from them and the behaviour
    logprobs with TRL's ``vllm_importance_sampling_*`` settings (pass the trainer's). ``as_torch`` makes torch
    tensors; otherwise numpy arrays (int64 ids, masks and ``num_items_in_batch``, float32 values)."""
    if world_size < 1:
        raise UsageError(f"world_size must be at least 1, not {world_size}")
    prompt_T, prompt_off, comp_T, comp_off = _prompt_and_response(rows)
    prompt_ids = pad_ragged(prompt_T, prompt_off, None, pad_id, left=True)
    prompt_mask = pad_ragged(np.ones(len(prompt_T), dtype=np.int64), prompt_off, prompt_ids.shape[1], 0, left=True)
    completion_ids = pad_ragged(comp_T, comp_off, None, pad_id)
    width = completion_ids.shape[1]
    completion_mask = pad_ragged(np.ones(len(comp_T), dtype=np.int64), comp_off, width, 0)
    loss_mask = pad_ragged(rows.loss_mask_C.astype(np.int64), comp_off, width, 0)
    sampling = pad_ragged(rows.behavior_logprobs_C, comp_off, width, 0.0)
    local_items = int(loss_mask.sum())
    if num_items_in_batch is None:
        if world_size > 1:
            raise UsageError(
                f"with world_size={world_size}, pass num_items_in_batch: the loss-mask tokens summed over every "
                f"process (this one has {local_items}), as TRL gathers them"
            )
        num_items_in_batch = local_items
    elif num_items_in_batch < local_items:
        raise UsageError(
            f"num_items_in_batch={num_items_in_batch} is below this process's own {local_items} loss-mask tokens"
        )
    if old_per_token_logps is None:
        old = sampling
    else:
        if hasattr(old_per_token_logps, "detach"):  # a torch tensor
            old_per_token_logps = old_per_token_logps.detach().float().cpu().numpy()
        old = np.asarray(old_per_token_logps, dtype=np.float32)
        if old.shape != sampling.shape:
            raise UsageError(f"old_per_token_logps has shape {old.shape}, the completions {sampling.shape}")
    if token_advantages is None:
        token_advantages = not _advantages_are_per_row(rows)
    out: dict[str, Any] = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": (
            pad_ragged(rows.token_advantages_C, comp_off, width, 0.0)
            if token_advantages
            else rows.advantage_N.astype(np.float32)
        ),
        "old_per_token_logps": old if old is not sampling else sampling.copy(),
        "sampling_per_token_logps": sampling,
        "importance_sampling_ratio": importance_sampling_ratio(
            old,
            sampling,
            loss_mask,
            importance_sampling_mode,
            importance_sampling_clip_min,
            importance_sampling_clip_max,
        ),
        "num_items_in_batch": np.array(num_items_in_batch, dtype=np.int64),
    }
    if not rows.loss_mask_C.all():
        out["tool_mask"] = loss_mask
    if rows.ref_logprobs_C is not None:
        out["ref_per_token_logps"] = pad_ragged(rows.ref_logprobs_C, comp_off, width, 0.0)
    if as_torch:
        import torch

        # torch.from_numpy keeps a 0-d array 0-d (np.ascontiguousarray would make it 1-d)
        out = {k: torch.from_numpy(v if v.flags.c_contiguous else np.ascontiguousarray(v)) for k, v in out.items()}
    return out
