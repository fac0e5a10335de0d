"""``special`` check: how a completion ends and which special tokens it holds.

Reasons (both ``warn``; completion positions):

- ``special_no_stop``: ``finish_reason == "stop"`` but the last token is not EOS or another stop / end-of-turn
  token (a stop string, or a lost EOS), at the last position.
- ``special_mid_completion``: a special added token (``special=True``) inside the completion, other than at
  its end or at the end of a scored span of a stitched multi-turn completion (where ``completion_mask`` turns
  false), at the first such position.
"""

from __future__ import annotations

import numpy as np

from prl.checks.arrays import first_per_row
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.tokenizer import CheckTokenizer


def check_special(batch: TokenBatch, tok: CheckTokenizer, use_R: np.ndarray) -> Findings:
    """Findings for rows ``use_R`` (IDs in vocabulary)."""
    out = Findings()
    comp = batch.completion
    n_R = comp.lengths
    last_idx = np.maximum(comp.offsets[1:] - 1, 0)
    has_last = n_R > 0
    last_id = np.where(
        has_last,
        comp.values[np.minimum(last_idx, max(len(comp.values) - 1, 0))] if len(comp.values) else -1,
        -1,
    )
    ends_in_stop = has_last & np.isin(last_id, tok.stop_ids)
    stop_R = batch.finish_reason == "stop"
    out.add(stop_R & ~ends_in_stop & use_R, "special_no_stop", np.maximum(n_R - 1, 0))

    vals = comp.values
    if len(vals) == 0:
        return out
    lut = tok.special_lut
    special_T = lut[np.clip(vals, 0, len(lut) - 1)] & use_R[comp.row_of]
    is_last_T = np.zeros(len(vals), dtype=bool)
    is_last_T[comp.offsets[1:][has_last] - 1] = True
    scored_T = batch.scored_T()
    next_scored_T = np.concatenate((scored_T[1:], [False]))
    stray_T = special_T & ~is_last_T & scored_T & next_scored_T
    first = first_per_row(stray_T, comp)
    out.add(first >= 0, "special_mid_completion", first)
    return out
