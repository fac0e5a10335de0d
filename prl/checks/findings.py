"""Per-sample findings: what each check reports, before verdicts are assembled.

A check returns a :class:`Findings` for a batch of ``R`` rows: sparse (row, reason code, position, evidence)
entries. Most samples are clean, so findings are stored as lists built from numpy masks in one call per
reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Findings:
    """Sparse findings for one batch: ``rows[i]`` has ``reasons[i]`` at ``positions[i]`` (-1: no position)."""

    rows: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    evidence: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)

    def add(
        self,
        mask_R: np.ndarray,
        reason: str,
        positions_R: np.ndarray | None = None,
    ) -> np.ndarray:
        """Record ``reason`` for every row where ``mask_R`` holds; returns those row indices."""
        hit = np.flatnonzero(mask_R)
        if len(hit) == 0:
            return hit
        self.rows.extend(hit.tolist())
        self.reasons.extend([reason] * len(hit))
        if positions_R is None:
            self.positions.extend([-1] * len(hit))
        else:
            self.positions.extend(np.asarray(positions_R)[hit].astype(np.int64).tolist())
        return hit

    def add_one(self, row: int, reason: str, position: int = -1, evidence: dict[str, Any] | None = None) -> None:
        self.rows.append(int(row))
        self.reasons.append(reason)
        self.positions.append(int(position))
        if evidence:
            self.evidence[(int(row), reason)] = evidence

    def extend(self, other: Findings) -> None:
        self.rows.extend(other.rows)
        self.reasons.extend(other.reasons)
        self.positions.extend(other.positions)
        self.evidence.update(other.evidence)
