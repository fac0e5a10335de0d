"""``vocab`` check: every prompt and completion token ID lies in ``[0, vocab_size)``.

Reasons (both ``invalid``): ``vocab_prompt`` / ``vocab_completion`` at the first out-of-range position.
"""

from __future__ import annotations

import numpy as np

from prl.checks.arrays import first_per_row
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings


def check_vocab(batch: TokenBatch, vocab_size: int) -> tuple[Findings, np.ndarray]:
    """Findings, and bool[R]: rows whose IDs are all in range (safe to decode)."""
    out = Findings()
    ok_R = np.ones(batch.rows, dtype=bool)
    for name, rag in (("prompt", batch.prompt), ("completion", batch.completion)):
        bad_T = (rag.values < 0) | (rag.values >= vocab_size)
        first_R = first_per_row(bad_T, rag)
        hit = first_R >= 0
        out.add(hit, f"vocab_{name}", first_R)
        ok_R &= ~hit
    return out, ok_R


def max_id(batch: TokenBatch) -> int:
    """Largest token ID in the batch (-1 when empty)."""
    tops = [int(r.values.max()) for r in (batch.prompt, batch.completion) if len(r.values)]
    return max(tops, default=-1)
