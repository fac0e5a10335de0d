"""Shard rows as Tinker ``Datum`` objects, built with the Tinker SDK's own constructors (``pip install tinker``).

A row of ``L`` tokens (``input_ids`` = prompt + completion) becomes ``model_input = ModelInput.from_ints(tokens[:-1])``
and ``loss_fn_inputs`` of ``L − 1`` target positions: ``target_tokens`` = ``tokens[1:]`` (int64), ``logprobs`` and
``advantages`` (float32), and, when asked, ``mask`` (float32, 1.0 where the shard's ``loss_mask`` is true), the
optional input tinker-cookbook's ``trajectory_to_data`` carries and strips before the loss. Target ``j`` predicts
``tokens[j + 1]``, so completion token ``c`` sits at ``j = prompt_len + c − 1``. Prompt positions, and completion
positions outside the loss mask, hold advantage 0.0 (they take no part in the loss); a logprob the server did not
give is 0.0. With ``prompt_len == 0`` the first completion token has no predecessor and is not a target; rows of
fewer than two tokens make no datum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from prl.loaders.rows import Rows


@dataclass
class TinkerArrays:
    """Flat arrays of the datums of a batch of rows: ``tokens_T`` with ``tok_off_N1``, and per target position
    (``L_i − 1`` per row, ``j_off_N1``) ``logprobs_J``, ``advantages_J``, ``mask_J`` (float32)."""

    tokens_T: np.ndarray
    tok_off_N1: np.ndarray
    logprobs_J: np.ndarray
    advantages_J: np.ndarray
    mask_J: np.ndarray
    j_off_N1: np.ndarray

    def has_datum(self, i: int) -> bool:
        """Whether row ``i`` has at least one target (two or more tokens)."""
        return bool(self.j_off_N1[i + 1] > self.j_off_N1[i])


def tinker_arrays(rows: Rows) -> TinkerArrays:
    """The datum arrays of ``rows``, vectorized (see the module docstring)."""
    targets_N = np.maximum(rows.seq_len_N - 1, 0)
    j_off = np.zeros(rows.num_rows + 1, dtype=np.int64)
    np.cumsum(targets_N, out=j_off[1:])
    row_C, pos_C = rows.completion_positions()
    j_C = pos_C - 1
    keep = j_C >= 0
    dest = j_off[:-1][row_C[keep]] + j_C[keep]
    total = int(j_off[-1])
    logprobs, advantages, mask = (np.zeros(total, dtype=np.float32) for _ in range(3))
    logprobs[dest] = rows.behavior_logprobs_C[keep]
    in_loss = rows.loss_mask_C[keep]
    advantages[dest] = np.where(in_loss, rows.token_advantages_C[keep], np.float32(0.0))
    mask[dest] = in_loss
    return TinkerArrays(rows.input_ids_T.astype(np.int64), rows.seq_off_N1, logprobs, advantages, mask, j_off)


def datum_json(arrays: TinkerArrays, i: int, with_mask: bool = False) -> dict[str, Any]:
    """The JSON form of row ``i``'s datum (the Tinker wire shape), arrays as numpy for ``orjson``."""
    a, b = int(arrays.tok_off_N1[i]), int(arrays.tok_off_N1[i + 1])
    ja, jb = int(arrays.j_off_N1[i]), int(arrays.j_off_N1[i + 1])

    def tensor(data: np.ndarray, dtype: str) -> dict[str, Any]:
        return {"data": data, "dtype": dtype, "shape": [len(data)]}

    inputs = {
        "target_tokens": tensor(arrays.tokens_T[a + 1 : b], "int64"),
        "logprobs": tensor(arrays.logprobs_J[ja:jb], "float32"),
        "advantages": tensor(arrays.advantages_J[ja:jb], "float32"),
    }
    if with_mask:
        inputs["mask"] = tensor(arrays.mask_J[ja:jb], "float32")
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": arrays.tokens_T[a : b - 1]}]},
        "loss_fn_inputs": inputs,
    }


def to_tinker(rows: Rows, with_mask: bool = False) -> list[Any]:
    """One ``tinker.types.Datum`` per row of two or more tokens, in row order (see the module docstring).
    Needs the ``tinker`` package; raises ImportError naming it otherwise."""
    try:
        from tinker import types
    except ImportError as exc:  # pragma: no cover - exercised only without the SDK
        raise ImportError("to_tinker needs the Tinker SDK: pip install 'prl[tinker]'") from exc
    arrays = tinker_arrays(rows)
    out = []
    for i in range(rows.num_rows):
        if not arrays.has_datum(i):
            continue
        a, b = int(arrays.tok_off_N1[i]), int(arrays.tok_off_N1[i + 1])
        ja, jb = int(arrays.j_off_N1[i]), int(arrays.j_off_N1[i + 1])
        inputs = {
            "target_tokens": types.TensorData.from_numpy(arrays.tokens_T[a + 1 : b]),
            "logprobs": types.TensorData.from_numpy(arrays.logprobs_J[ja:jb]),
            "advantages": types.TensorData.from_numpy(arrays.advantages_J[ja:jb]),
        }
        if with_mask:
            inputs["mask"] = types.TensorData.from_numpy(arrays.mask_J[ja:jb])
        model_input = types.ModelInput.from_ints(arrays.tokens_T[a : b - 1].tolist())
        out.append(types.Datum(model_input=model_input, loss_fn_inputs=inputs))
    return out
