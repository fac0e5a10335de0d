"""``logprobs`` check: sampled-token logprobs line up with the tokens and look like a sampler's.

Reasons and verdicts (positions are completion positions):

- ``logprob_count`` (invalid): ``len(completion_logprobs) != len(completion_token_ids)``, at the shorter
  length. The per-token tests below are skipped for such rows (alignment is unknown).
- ``mask_count`` (invalid): ``completion_mask`` present with a different length.
- ``logprob_missing`` (invalid): a null logprob on a scored token (mask true).
- ``logprob_nonfinite`` (invalid): NaN or ±inf.
- ``logprob_positive`` (invalid): above ``positive_atol``.
- ``logprob_placeholder`` (drift): exact 0.0 on at least ``placeholder_fraction`` of the scored tokens (with
  at least ``placeholder_min_tokens``), or a run of ``placeholder_run`` exact zeros; not applied to greedy
  rows (temperature 0), whose processed logprobs are legitimately 0.
- ``logprob_low`` (drift): many sampled tokens below ``low_logprob`` — a sampler almost never draws them, text
  that was re-tokenized after sampling produces them.
"""

from __future__ import annotations

import numpy as np

from prl.checks.arrays import count_per_row, first_per_row, longest_run_per_row
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.options import CheckOptions


def check_logprobs(batch: TokenBatch, opts: CheckOptions) -> Findings:
    out = Findings()
    comp, lp = batch.completion, batch.logprobs
    n_R = comp.lengths
    count_bad_R = lp.lengths != n_R
    out.add(count_bad_R, "logprob_count", np.minimum(lp.lengths, n_R))
    if batch.mask is not None:
        out.add(batch.mask.valid & (batch.mask.lengths != n_R), "mask_count", np.minimum(batch.mask.lengths, n_R))

    # per-token tests only on rows whose counts agree, so values line up with completion tokens
    aligned_T = ~count_bad_R[lp.row_of]
    scored_T = np.zeros(len(lp.values), dtype=bool)
    scored_T[aligned_T] = batch.scored_T()[~count_bad_R[comp.row_of]]
    values = lp.values
    nulls_T = lp.nulls if lp.nulls is not None else np.zeros(len(values), dtype=bool)

    missing_T = nulls_T & scored_T
    first = first_per_row(missing_T, lp)
    out.add(first >= 0, "logprob_missing", first)
    with np.errstate(invalid="ignore"):
        nonfinite_T = ~np.isfinite(values) & ~nulls_T & aligned_T
        first = first_per_row(nonfinite_T, lp)
        out.add(first >= 0, "logprob_nonfinite", first)
        positive_T = (values > opts.positive_atol) & ~nulls_T & aligned_T
        first = first_per_row(positive_T, lp)
        out.add(first >= 0, "logprob_positive", first)

        scored_R = count_per_row(scored_T & ~nulls_T, lp)
        zero_T = (values == 0.0) & scored_T & ~nulls_T
        zeros_R = count_per_row(zero_T, lp)
        run_R = longest_run_per_row(zero_T, lp)
        greedy_R = batch.temperature == 0.0
        placeholder_R = (
            (scored_R >= opts.placeholder_min_tokens) & (zeros_R >= opts.placeholder_fraction * np.maximum(scored_R, 1))
        ) | (run_R >= opts.placeholder_run)
        first = first_per_row(zero_T, lp)
        out.add(placeholder_R & ~greedy_R & ~count_bad_R, "logprob_placeholder", first)

        low_T = (values < opts.low_logprob) & scored_T & ~nulls_T & np.isfinite(values)
        low_R = count_per_row(low_T, lp)
        signature_R = (low_R >= opts.low_logprob_min_count) & (
            low_R >= opts.low_logprob_fraction * np.maximum(scored_R, 1)
        )
        first = first_per_row(low_T, lp)
        out.add(signature_R & ~count_bad_R, "logprob_low", first)
    return out
