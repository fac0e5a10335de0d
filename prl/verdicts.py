"""Check reasons and the verdicts they force: what check-tokens writes and build-shards reads.

Reason codes, their check family and the verdict they force (the worst one wins: invalid > drift > warn > note >
ok). ``invalid`` and ``drift`` say the sample would train on wrong tokens or wrong logprobs; ``warn`` says a check
could not be completed; ``note`` is information about a sample whose IDs are as sampled (docs/verdicts.md):

=============================  =========  =======  ===========================================================
reason                         check      verdict  meaning
=============================  =========  =======  ===========================================================
vocab_prompt/_completion       vocab      invalid  a token ID outside [0, vocab size)
logprob_count                  logprobs   invalid  len(logprobs) ≠ len(completion IDs) (off by one, …)
mask_count                     logprobs   invalid  len(completion_mask) ≠ len(completion IDs)
logprob_missing                logprobs   invalid  null logprob on a scored token
logprob_nonfinite              logprobs   invalid  NaN / ±inf
logprob_positive               logprobs   invalid  logprob > 0
heads_*                        heads      invalid  malformed, misaligned or degenerate top-k heads
roundtrip_prompt               roundtrip  drift    encode(decode(prompt IDs)) ≠ prompt IDs
template_prompt                template   drift    chat template rendering ≠ prompt IDs
logprob_placeholder            logprobs   drift    exact 0.0 placeholders
logprob_low                    logprobs   drift    many sampled tokens below −15: retokenized data
template_error                 template   warn     messages could not be parsed or rendered
template_budget                template   warn     rendering broke its time, memory or size budget
roundtrip_completion           roundtrip  note     sampled IDs whose text re-encodes to other IDs
roundtrip_boundary             roundtrip  note     the prompt round-trips alone; prompt + completion merge at the
                                                   boundary (``"." + "skin"`` re-encodes as ``".s" + "kin"``)
roundtrip_partial_char         roundtrip  note     a UTF-8 character cut at the end of the sequence
prefix_fork                    prefix     note     previous turn is not a prefix of this prompt
prefix_realign                 prefix     note     only the previous turn's last few tokens differ
prefix_unordered               prefix     note     the previous turn of its trajectory cannot be determined
special_no_stop                special    note     finish_reason stop without a stop token at the end
special_mid_completion         special    note     a special token the model sampled inside the completion
=============================  =========  =======  ===========================================================

``first_divergence`` is the position of the worst reason that has one (a prompt position for ``*_prompt``,
``template_*`` and ``prefix_*`` reasons, a completion position otherwise); ``detail`` is a JSON object with
each reason's position and, for the worst reason, the token window as ``[id, piece]`` pairs.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEVERITY = {"ok": 0, "note": 1, "warn": 2, "drift": 3, "invalid": 4}

REASONS: dict[str, tuple[str, str]] = {
    "vocab_prompt": ("vocab", "invalid"),
    "vocab_completion": ("vocab", "invalid"),
    "logprob_count": ("logprobs", "invalid"),
    "mask_count": ("logprobs", "invalid"),
    "logprob_missing": ("logprobs", "invalid"),
    "logprob_nonfinite": ("logprobs", "invalid"),
    "logprob_positive": ("logprobs", "invalid"),
    "heads_shape": ("heads", "invalid"),
    "heads_k_varies": ("heads", "invalid"),
    "heads_id_range": ("heads", "invalid"),
    "heads_id_duplicate": ("heads", "invalid"),
    "heads_nonfinite": ("heads", "invalid"),
    "heads_not_sorted": ("heads", "invalid"),
    "heads_positive": ("heads", "invalid"),
    "heads_mass": ("heads", "invalid"),
    "heads_misaligned": ("heads", "invalid"),
    "heads_degenerate": ("heads", "invalid"),
    "roundtrip_prompt": ("roundtrip", "drift"),
    "template_prompt": ("template", "drift"),
    "logprob_placeholder": ("logprobs", "drift"),
    "logprob_low": ("logprobs", "drift"),
    "template_error": ("template", "warn"),
    "template_budget": ("template", "warn"),
    "roundtrip_completion": ("roundtrip", "note"),
    "roundtrip_boundary": ("roundtrip", "note"),
    "roundtrip_partial_char": ("roundtrip", "note"),
    "prefix_fork": ("prefix", "note"),
    "prefix_realign": ("prefix", "note"),
    "prefix_unordered": ("prefix", "note"),
    "special_no_stop": ("special", "note"),
    "special_mid_completion": ("special", "note"),
}
"""reason code → (check family, verdict)."""

CHECK_FAMILIES = ("vocab", "logprobs", "roundtrip", "template", "prefix", "special", "heads")


_GRADES = tuple(SEVERITY)


def regrade(verdict: pa.Array, reasons: pa.Array) -> pa.Array:
    """Each row's verdict as :data:`REASONS` grades its ``reasons`` now (string[n]): the worst of them, so that
    checks written under another reason table (a reason moved from ``drift`` to ``note``) are read as graded
    today. A row without reasons, or with one the table does not know, keeps the ``verdict`` it was given."""
    verdict = verdict.combine_chunks() if isinstance(verdict, pa.ChunkedArray) else verdict
    reasons = reasons.combine_chunks() if isinstance(reasons, pa.ChunkedArray) else reasons
    n = len(verdict)
    if n == 0:
        return verdict
    codes = pa.array(list(REASONS), pa.string())
    grade_of = np.array([SEVERITY[v] for _, v in REASONS.values()] + [-1], dtype=np.int64)
    flat = pc.list_flatten(reasons)
    rows = pc.list_parent_indices(reasons).to_numpy(zero_copy_only=False)
    index = pc.fill_null(pc.index_in(flat, value_set=codes), len(codes)).to_numpy(zero_copy_only=False)
    worst = np.zeros(n, dtype=np.int64)
    np.maximum.at(worst, rows, grade_of[index])
    unknown = np.zeros(n, dtype=bool)
    unknown[rows[index == len(codes)]] = True
    graded = pa.array(np.asarray(_GRADES, dtype=object)[worst], pa.string())
    none = pc.fill_null(pc.list_value_length(reasons), 0).to_numpy(zero_copy_only=False) == 0
    keep = pa.array(unknown | none)
    return pc.if_else(keep, verdict, graded)


__all__ = ["CHECK_FAMILIES", "REASONS", "SEVERITY", "regrade"]
