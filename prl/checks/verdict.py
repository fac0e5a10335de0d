"""Verdict assembly: per-sample findings of every check → one ``checks`` row (schema ``prl.schema.CHECKS``); the
reason codes and the verdicts they force are :mod:`prl.verdicts`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.tokenizer import CheckTokenizer
from prl.schema import CHECKS
from prl.verdicts import REASONS, SEVERITY

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
