"""The per-row values the parts of a build read, on disk in final order while the parts are written.

Once the plan and the scores are made, every shipped row's plan values that a part writes (ids, version,
sampling settings: :data:`PART_COLUMNS`), its scores, its merged unit (``merge_turns``) and where its token
columns sit in the spills (:meth:`prl.shards.spill.ScanSpill.locate`) go to one Arrow IPC file, one record batch
per part (parts are runs of the final order), written a part at a time. A part reads back its own batch and nothing else
(:meth:`ShipRows.read`), so while the parts are written the shipped rows' values are on disk, not in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from prl.shards.merge_build import TURN_SCALARS
from prl.shards.scores import Scores
from prl.shards.spill import ScanSpill

PART_COLUMNS = TURN_SCALARS
"""Plan columns a part writes (those in the plan's shipped frame), as they are: what a merged row takes of its
turns (:data:`prl.shards.merge_build.TURN_SCALARS`) is what every part reads."""


def _places(prefix: str, spill: ScanSpill, rows_N: np.ndarray) -> dict[str, pa.Array]:
    """:meth:`ScanSpill.locate` of ``rows_N`` in every flat column of ``spill`` (what a part gathers) as Arrow
    columns, names prefixed with ``prefix``."""
    return {f"{prefix}{k}": pa.array(v) for k, v in spill.locate(rows_N, list(spill.raw)).items()}


@dataclass(frozen=True)
class ShipRows:
    """The file (``path``) of the shipped rows' part values; batch ``s`` holds part ``s``'s rows."""

    path: str

    @classmethod
    def write(
        cls,
        path: str,
        ship: pl.DataFrame,
        bounds_S1: np.ndarray,
        traces: ScanSpill,
        ref: ScanSpill | None,
        scores: Scores,
        units_N: np.ndarray | None = None,
    ) -> ShipRows:
        """Write the part values of ``ship`` (the plan's shipped rows, final order; part ``s`` is the rows
        ``bounds_S1[s]:bounds_S1[s + 1]``): the :data:`PART_COLUMNS` it has, ``has_mask``, each row's scores
        (``s.`` columns; with ``units_N``, each row's unit, ``unit``, and its unit's scores: ``scores`` are then
        per unit), and each row's place in ``traces`` (``t.`` columns) and ``ref`` (``r.`` columns, from
        ``ref_row``)."""
        present = [c for c in (*PART_COLUMNS, "has_mask") if c in ship.columns]
        units = None if units_N is None else np.asarray(units_N, dtype=np.int64)
        with pa.OSFile(path, "wb") as sink:
            writer = None
            for lo, hi in zip(bounds_S1[:-1].tolist(), bounds_S1[1:].tolist(), strict=True):
                part = ship.slice(lo, hi - lo)  # one part's rows at a time: no array as long as the samples
                per_row = slice(lo, hi) if units is None else units[lo:hi]
                columns = {c: part.get_column(c).to_arrow() for c in present}
                columns["s.reward"] = pa.array(scores.reward_N[per_row])
                columns["s.advantage"] = pa.array(scores.advantage_N[per_row])
                columns["s.group_size"] = pa.array(scores.group_size_N[per_row])
                if units is not None:
                    columns["unit"] = pa.array(units[lo:hi])
                columns |= _places("t.", traces, part.get_column("row").to_numpy())
                if ref is not None:
                    columns |= _places("r.", ref, part.get_column("ref_row").to_numpy())
                batch = pa.RecordBatch.from_pydict(columns)
                if writer is None:
                    writer = pa.ipc.new_file(sink, batch.schema)
                writer.write_batch(batch)
            if writer is not None:
                writer.close()
        return cls(path)

    def read(self, s: int) -> pa.RecordBatch:
        """Part ``s``'s rows (read into memory; the file is not mapped)."""
        with pa.OSFile(self.path, "rb") as source:
            return pa.ipc.open_file(source).get_batch(s)


def located(batch: pa.RecordBatch, prefix: str) -> dict[str, np.ndarray]:
    """The spill places of ``batch`` (:meth:`ShipRows.read`) under ``prefix`` (``t.`` or ``r.``), as
    :meth:`ScanSpill.flat_at` reads them."""
    n = len(prefix)
    return {
        name[n:]: batch.column(name).to_numpy(zero_copy_only=False)
        for name in batch.schema.names
        if name.startswith(prefix)
    }


def part_scores(batch: pa.RecordBatch, mean_d: float) -> tuple[Scores, np.ndarray | None]:
    """``(scores, units_N)`` of a part's ``batch``: its rows' scores (the batch mean log ratio ``mean_d`` beside
    them) and no units; with merged turns, the scores of its units in order and each row's unit among them (from
    0: a unit's turns are one run of rows, never split between parts). The singleton counts are the build's
    business, not a part's: 0."""
    reward, advantage = batch.column("s.reward").to_numpy(), batch.column("s.advantage").to_numpy()
    group_size = batch.column("s.group_size").to_numpy()
    if "unit" not in batch.schema.names:
        return Scores(reward, advantage, group_size, mean_d, 0, 0), None
    units_N = batch.column("unit").to_numpy()
    units_N = units_N - units_N[0] if len(units_N) else units_N
    first = np.flatnonzero(np.diff(units_N, prepend=-1))  # the first turn of each unit
    return Scores(reward[first], advantage[first], group_size[first], mean_d, 0, 0), units_N


def part_meta(batch: pa.RecordBatch) -> pl.DataFrame:
    """The :data:`PART_COLUMNS` of ``batch``, as polars (what the assembly reads as the part's plan rows)."""
    out = pl.from_arrow(batch.select([c for c in PART_COLUMNS if c in batch.schema.names]))
    assert isinstance(out, pl.DataFrame)
    return out


__all__ = ["PART_COLUMNS", "ShipRows", "located", "part_meta", "part_scores"]
