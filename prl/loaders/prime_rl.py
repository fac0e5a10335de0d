"""Shard rows as prime-rl ``TrainingSample`` records (the orchestrator → trainer transport, msgspec structs).

The contract, read from prime-rl's source (PrimeIntellect-ai/prime-rl at
559b44772e471d1538537b8805cc77f3824a5e64, ``src/prime_rl/transports/rollouts/types.py``): one sample is one flat
token sequence, ``token_ids`` with ``mask`` (trainable tokens), ``logprobs`` and ``temperatures`` aligned per token
and as long as ``token_ids``; ``env_name``; optional ``ref_logprobs`` and ``advantages``, also full-length (the
orchestrator broadcasts a scalar advantage over the completion). The remaining optional fields (multimodal
inputs, routed experts, per-component weights) are left out, which the struct's defaults allow.

Each record is a plain dict with exactly those field names, so ``TrainingSample(**record)`` builds the
struct (prime-rl need not be installed to produce them). Prompt positions hold ``mask`` False, logprob,
advantage and reference logprob 0.0; a temperature the trace did not record is 1.0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prl.loaders.rows import Rows


def to_prime_rl(rows: Rows, env_name: str = "prl") -> list[dict[str, Any]]:
    """One ``TrainingSample``-shaped dict per row (see the module docstring)."""
    total = int(rows.seq_off_N1[-1])
    row_C, pos_C = rows.completion_positions()
    at_C = rows.seq_off_N1[:-1][row_C] + pos_C
    mask_T = np.zeros(total, dtype=bool)
    mask_T[at_C] = rows.loss_mask_C
    logprobs_T = np.zeros(total, dtype=np.float64)
    logprobs_T[at_C] = rows.behavior_logprobs_C
    advantages_T = np.zeros(total, dtype=np.float64)
    advantages_T[at_C] = rows.token_advantages_C
    ref_T = None
    if rows.ref_logprobs_C is not None:
        ref_T = np.zeros(total, dtype=np.float64)
        ref_T[at_C] = rows.ref_logprobs_C
    temperature_N = np.ones(rows.num_rows) if rows.temperature_N is None else rows.temperature_N.astype(np.float64)
    temperature_N = np.where(np.isfinite(temperature_N), temperature_N, 1.0)
    # one list conversion per array, then slices per row (Python lists are what msgspec structs hold)
    ids, mask, lps, adv = (a.tolist() for a in (rows.input_ids_T, mask_T, logprobs_T, advantages_T))
    refs = ref_T.tolist() if ref_T is not None else None
    off = rows.seq_off_N1.tolist()
    out = []
    for i in range(rows.num_rows):
        a, b = off[i], off[i + 1]
        record: dict[str, Any] = {
            "token_ids": ids[a:b],
            "mask": mask[a:b],
            "logprobs": lps[a:b],
            "temperatures": [float(temperature_N[i])] * (b - a),
            "env_name": env_name,
            "advantages": adv[a:b],
        }
        if refs is not None:
            record["ref_logprobs"] = refs[a:b]
        out.append(record)
    return out
