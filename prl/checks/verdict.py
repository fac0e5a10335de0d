"""Verdict assembly: per-sample findings of every check → one ``checks`` row (schema ``prl.schema.CHECKS``).

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

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.tokenizer import CheckTokenizer
from prl.schema import CHECKS

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
_ORDER = {code: i for i, code in enumerate(REASONS)}
_RANK = {code: (-SEVERITY[verdict], _ORDER[code]) for code, (_, verdict) in REASONS.items()}
"""reason code → its place among a row's reasons: the worst verdict first, then the table's order."""


@dataclass(slots=True)
class RowVerdict:
    """What the run summary keeps of one non-ok row."""

    row: int
    verdict: str
    reasons: list[str]
    position: int | None
    detail: dict[str, Any]


def assemble(
    batch: TokenBatch,
    findings: Findings,
    prefix_status: Sequence[str | None],
    heads_present_R: np.ndarray,
    fingerprint: str,
    tok: CheckTokenizer,
    checked_at: datetime | None = None,
) -> tuple[pa.RecordBatch, list[RowVerdict]]:
    """The ``checks`` rows of a batch, and the non-ok rows for the summary."""
    n = batch.rows
    per_row: dict[int, list[tuple[str, int]]] = {}
    for r, code, pos in zip(findings.rows, findings.reasons, findings.positions, strict=False):
        per_row.setdefault(r, []).append((code, pos))
    verdicts = ["ok"] * n
    first: list[int | None] = [None] * n
    heads_bad = np.zeros(n, dtype=bool)
    flagged: list[RowVerdict] = []
    primaries: list[tuple[int, str, dict[str, Any]]] = []
    evidence = findings.evidence
    for r, items in per_row.items():
        fv = _row_verdict(r, items, evidence)
        verdicts[r], first[r] = fv.verdict, fv.position
        if not _HEADS.isdisjoint(fv.reasons):
            heads_bad[r] = True
        main_code = fv.detail["primary"]
        if shown := evidence.get((r, main_code)):
            primaries.append((r, main_code, shown))
        flagged.append(fv)
    _attach_pieces(primaries, {fv.row: fv.detail for fv in flagged}, tok)
    details: list[bytes | None] = [None] * n
    for fv in flagged:
        details[fv.row] = orjson.dumps(fv.detail)

    rec = batch.record
    stamp = checked_at or datetime.now(UTC)
    present = np.asarray(heads_present_R, dtype=bool)
    out = pa.RecordBatch.from_arrays(
        [
            rec.column("sample_id"),
            pa.repeat(pa.scalar(fingerprint, pa.string()), n),
            pa.array(verdicts, pa.string()),
            _reasons_column(n, flagged),
            pa.array(first, pa.int32()),
            pa.array(list(prefix_status), pa.string()),
            pa.array(~heads_bad, pa.bool_(), mask=~present),
            pa.array(details, pa.string()),
            rec.column("source_format"),
            rec.column("model"),
            rec.column("policy_version"),
            pa.repeat(pa.scalar(stamp, CHECKS.field("checked_at").type), n),
        ],
        schema=CHECKS,
    )
    return out, flagged


def _reasons_column(n: int, flagged: list[RowVerdict]) -> pa.Array:
    """list<string>[n]: each flagged row's reason codes, empty lists elsewhere."""
    lengths = np.zeros(n, dtype=np.int32)
    lengths[[fv.row for fv in flagged]] = [len(fv.reasons) for fv in flagged]
    order = sorted(range(len(flagged)), key=lambda i: flagged[i].row)
    codes = pa.array([code for i in order for code in flagged[i].reasons], pa.string())
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), codes)


_HEADS = frozenset(code for code, (family, _) in REASONS.items() if family == "heads")
_NOTED = ("template_error", "template_budget")
"""Reasons whose error message goes into the detail whether or not they are the primary one."""


def _row_verdict(r: int, items: list[tuple[str, int]], evidence: dict[tuple[int, str], dict[str, Any]]) -> RowVerdict:
    """One flagged row's verdict from its ``(reason, position)`` findings (sorted in place, worst first)."""
    if len(items) > 1:
        items.sort(key=lambda it: _RANK[it[0]])
        codes = sorted({c for c, _ in items}, key=_ORDER.__getitem__)
        primary = next(((c, p) for c, p in items if p >= 0), None)
        positions = {c: p for c, p in items if p >= 0}
    else:
        code, pos = items[0]
        codes = [code]
        primary = items[0] if pos >= 0 else None
        positions = {code: pos} if pos >= 0 else {}
    detail: dict[str, Any] = {"positions": positions, "primary": primary[0] if primary else items[0][0]}
    for code in _NOTED:
        if (r, code) in evidence:
            detail[code] = evidence[(r, code)].get("error")
    return RowVerdict(r, REASONS[items[0][0]][1], codes, primary[1] if primary else None, detail)


_ID_LISTS = ("ids", "reencoded", "rendered", "previous")


def _attach_pieces(
    primaries: list[tuple[int, str, dict[str, Any]]], details: dict[int, dict[str, Any]], tok: CheckTokenizer
) -> None:
    """Put each primary reason's evidence into its row's detail, token windows as [id, piece] pairs (each ID
    decoded once per tokenizer, :meth:`CheckTokenizer.piece_pairs`)."""
    pairs = tok.piece_pairs(chain.from_iterable(ev[key] for _, _, ev in primaries for key in _ID_LISTS if key in ev))
    pair = pairs.__getitem__
    for r, _code, ev in primaries:
        details[r]["evidence"] = {
            key: list(map(pair, value)) if key in _ID_LISTS else value for key, value in ev.items()
        }


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
