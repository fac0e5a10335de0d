"""Shard rows as the inputs TRL's ``GRPOTrainer`` computes its loss from.

The contract, read from TRL's source (huggingface/trl at f2cd57710ae345ea6428ae95363267fcf38a3dc8,
``trl/trainer/grpo_trainer.py``): ``_generate_and_score_completions`` returns ``prompt_ids`` / ``prompt_mask``
[B, P] left-padded, ``completion_ids`` / ``completion_mask`` [B, C] right-padded, ``advantages`` [B] (``_compute_loss``
also takes [B, C] and then uses it per token), ``num_items_in_batch``, and when known ``old_per_token_logps``,
``sampling_per_token_logps`` (the inference engine's logprobs, for importance-sampling correction),
``ref_per_token_logps`` [B, C]; multi-turn rows add ``tool_mask`` [B, C], and the loss mask is
``completion_mask * tool_mask``.

Here ``completion_mask`` is 1 on every completion token, ``tool_mask`` is the shard's ``loss_mask`` (given only
when some token is outside it), and both logprob keys hold the behaviour logprobs as sampled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prl.loaders.rows import Rows, pad_ragged
from prl.loaders.verl import _prompt_and_response


def to_trl_grpo(rows: Rows, pad_id: int = 0, token_advantages: bool = False, as_torch: bool = False) -> dict[str, Any]:
    """TRL GRPO's batch for ``rows`` (see the module docstring). ``advantages`` is the per-sample advantage
    [B], or with ``token_advantages`` the shard's per-token advantages [B, C] (needed when KL went into them).
    ``as_torch`` makes torch tensors; otherwise numpy arrays (int64 ids and masks, float32 values)."""
    prompt_T, prompt_off, comp_T, comp_off = _prompt_and_response(rows)
    prompt_ids = pad_ragged(prompt_T, prompt_off, None, pad_id, left=True)
    prompt_mask = pad_ragged(np.ones(len(prompt_T), dtype=np.int64), prompt_off, prompt_ids.shape[1], 0, left=True)
    completion_ids = pad_ragged(comp_T, comp_off, None, pad_id)
    width = completion_ids.shape[1]
    completion_mask = pad_ragged(np.ones(len(comp_T), dtype=np.int64), comp_off, width, 0)
    loss_mask = pad_ragged(rows.loss_mask_C.astype(np.int64), comp_off, width, 0)
    logps = pad_ragged(rows.behavior_logprobs_C, comp_off, width, 0.0)
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
        "old_per_token_logps": logps,
        "sampling_per_token_logps": logps.copy(),
        "num_items_in_batch": np.asarray(int(loss_mask.sum()), dtype=np.int64),
    }
    if not rows.loss_mask_C.all():
        out["tool_mask"] = loss_mask
    if rows.ref_logprobs_C is not None:
        out["ref_per_token_logps"] = pad_ragged(rows.ref_logprobs_C, comp_off, width, 0.0)
    if as_torch:
        import torch

        out = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
    return out
