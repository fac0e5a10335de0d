"""One batch of trace rows as the checks see it: ragged token columns plus the scalar columns they need."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from prl.checks.arrays import Ragged, concat_rows, ragged

COLUMNS = [
    "sample_id",
    "session_id",
    "turn",
    "created_at",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "completion_mask",
    "topk_ids",
    "topk_logprobs",
    "finish_reason",
    "temperature",
    "messages",
    "source_format",
    "model",
    "policy_version",
]
"""The traces columns the checks read."""


@dataclass
class TokenBatch:
    """``R`` trace rows. Token columns are :class:`Ragged` (int64 IDs, float64 logprobs with ``nulls``)."""

    record: pa.RecordBatch
    sample_id: list[str]
    prompt: Ragged
    completion: Ragged
    logprobs: Ragged
    mask: Ragged | None
    """completion_mask, None when the column is null on every row."""
    finish_reason: np.ndarray
    """object[R] of str."""
    temperature: np.ndarray
    """float64[R], NaN where unknown."""

    @classmethod
    def from_record_batch(cls, batch: pa.RecordBatch) -> TokenBatch:
        mask_col = batch.column("completion_mask")
        temperature = batch.column("temperature").to_numpy(zero_copy_only=False)
        return cls(
            record=batch,
            sample_id=batch.column("sample_id").to_pylist(),
            prompt=ragged(batch.column("prompt_token_ids"), np.int64),
            completion=ragged(batch.column("completion_token_ids"), np.int64),
            logprobs=ragged(batch.column("completion_logprobs"), np.float64, fill=np.nan),
            mask=None if mask_col.null_count == len(mask_col) else ragged(mask_col, bool, fill=True),
            finish_reason=np.asarray(batch.column("finish_reason").to_pylist(), dtype=object),
            temperature=np.asarray(temperature, dtype=np.float64),
        )

    @property
    def rows(self) -> int:
        return self.record.num_rows

    def scored_T(self) -> np.ndarray:
        """bool per completion token: True where the token is the model's own (``completion_mask`` true or
        absent for the row)."""
        if self.mask is None:
            return np.ones(len(self.completion.values), dtype=bool)
        out = np.ones(len(self.completion.values), dtype=bool)
        same = self.mask.valid & (self.mask.lengths == self.completion.lengths)
        rows = self.completion.row_of
        sel = same[rows]
        # masks of matching length line up value for value with the completion
        mask_rows = self.mask.row_of
        mask_sel = same[mask_rows]
        out[sel] = self.mask.values[mask_sel]
        return out

    def sequence(self) -> Ragged:
        """prompt + completion per row."""
        return concat_rows(self.prompt, self.completion)
