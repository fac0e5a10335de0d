"""One part of a shard set: gather its rows from the spills, assemble its table and write it (one file, hashed).

:class:`PartJob` holds everything the parts of one build share (the spills, the file of the shipped rows' plan
values, scores and places in the spills, :class:`prl.shards.shiprows.ShipRows`, and the options);
:meth:`PartJob.write` makes part ``s`` and returns its
:class:`PartWritten` (manifest entry and counts), the table itself already on disk. Every value in a part
depends only on its own samples, so the bytes do not depend on which thread, process or machine writes it:
:meth:`PartJob.write_published` is the engine's task (:mod:`prl.shards.build`: on the local engine one shard a
task on threads, on Ray a run of shards a task), and every engine yields the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow.compute as pc

from prl.shards import rowgroups
from prl.shards.assemble import Assembled, Gathered, assemble_shard
from prl.shards.gather import INPUT_IDS, mask_column
from prl.shards.manifest import FileEntry
from prl.shards.merge_build import assemble_merged_shard, kl_totals
from prl.shards.options import ShardOptions
from prl.shards.publish import publish_file
from prl.shards.rowgroups import row_groups
from prl.shards.scan import HEAD_COLUMNS
from prl.shards.scores import Scores
from prl.shards.shiprows import ShipRows, located, part_meta, part_scores
from prl.shards.spill import ScanSpill
from prl.shards.writer import ShardWriter


@dataclass
class Spills:
    """The build's spill files and their folder (removed once every shard is written)."""

    traces: ScanSpill
    ref: ScanSpill | None
    folder: str


@dataclass
class PartRows:
    """Part ``s``'s rows as read from the shipped rows' file: their plan values
    (:func:`prl.shards.shiprows.part_meta`), their scores, with ``merge_turns`` their merged units
    (:func:`prl.shards.shiprows.part_scores`), and where their token columns sit in the spills (``traces``,
    ``ref``: :func:`prl.shards.shiprows.located`). The token columns themselves are gathered a row group at a
    time, as the part is written (:meth:`PartJob.write`)."""

    meta: pl.DataFrame
    scores: Scores
    units_N: np.ndarray | None
    has_mask_N: np.ndarray
    traces: dict[str, np.ndarray]
    ref: dict[str, np.ndarray] | None

    def tokens_N(self) -> np.ndarray:
        """Prompt + completion tokens of each row (int64)."""
        return self.traces["prompt_token_ids:len"] + self.traces["completion_token_ids:len"]

    def slice(self, r0: int, r1: int) -> PartRows:
        """Rows ``[r0, r1)`` (whole merged units: a row group never splits a group), units renumbered from 0."""
        rows = slice(r0, r1)
        scores, units_N = self.scores, self.units_N
        if units_N is None:
            scores = scores.rows(rows)
        else:
            first, last = int(units_N[r0]), int(units_N[r1 - 1])
            scores, units_N = scores.rows(slice(first, last + 1)), units_N[rows] - first
        return PartRows(
            self.meta.slice(r0, r1 - r0),
            scores,
            units_N,
            self.has_mask_N[rows],
            {k: v[rows] for k, v in self.traces.items()},
            None if self.ref is None else {k: v[rows] for k, v in self.ref.items()},
        )


@dataclass(frozen=True)
class PartWritten:
    """One part written: its manifest entry, the sum (float64) and count of its per-token KL values, the
    loss-mask positions (and samples) taken out because a logprob there was null or not finite, and with
    ``merge_turns`` the tokens its turns hold one row each; with k3, the KL values at its cap."""

    shard: int
    entry: FileEntry
    kl_sum: float
    kl_tokens: int
    unsafe_tokens: int
    unsafe_samples: int
    unmerged_tokens: int = 0
    kl_capped: int = 0


@dataclass
class _Tally:
    """What the row groups of a part add up to, added in row-group order."""

    rows: int = 0
    tokens: int = 0
    completion_tokens: int = 0
    kl_sum: float = 0.0
    kl_tokens: int = 0
    unsafe_tokens: int = 0
    unsafe_samples: int = 0
    unmerged_tokens: int = 0
    kl_capped: int = 0

    def part(self, s: int, entry: FileEntry) -> PartWritten:
        """Part ``s`` written as ``entry``, with these counts."""
        kl = (self.kl_sum, self.kl_tokens)
        unsafe = (self.unsafe_tokens, self.unsafe_samples)
        return PartWritten(s, entry, *kl, *unsafe, self.unmerged_tokens, self.kl_capped)

    def add(self, a: Assembled) -> None:
        table = a.table
        self.rows += table.num_rows
        self.tokens += int(pc.sum(pc.list_value_length(table["input_ids"])).as_py() or 0)
        self.completion_tokens += int(pc.sum(pc.list_value_length(table["loss_mask"])).as_py() or 0)
        self.kl_sum += a.kl_sum
        self.kl_tokens += a.kl_tokens
        self.unsafe_tokens += a.unsafe_tokens
        self.unsafe_samples += a.unsafe_samples
        self.unmerged_tokens += a.unmerged_tokens
        self.kl_capped += a.kl_capped


def part_name(s: int) -> str:
    """File name of part ``s`` in a set folder."""
    return f"part-{s:05d}.parquet"


@dataclass
class PartJob:
    """What every part of one build needs. Part ``s`` holds the shipped rows ``bounds_S1[s]:bounds_S1[s + 1]``
    of the final order (their plan values, scores and spill places: ``rows``, batch ``s``) and is written into
    ``folder``; with ``merge_turns``, ``rows`` gives each shipped turn's merged unit
    (:func:`prl.shards.merge_build.unit_index`). ``mean_d``: the batch mean log ratio (:class:`Scores`)."""

    folder: str
    spills: Spills
    rows: ShipRows
    bounds_S1: np.ndarray
    mean_d: float
    options: ShardOptions
    k: int | None

    @property
    def parts(self) -> int:
        return len(self.bounds_S1) - 1

    def gather(self, s: int) -> PartRows:
        """Part ``s``'s rows: its batch of ``rows`` (plan values, scores and spill places; no token data yet)."""
        batch = self.rows.read(s)
        scores, units_N = part_scores(batch, self.mean_d)
        ref = located(batch, "r.") if self.spills.ref is not None else None
        has_mask_N = batch.column("has_mask").to_numpy(zero_copy_only=False)
        return PartRows(part_meta(batch), scores, units_N, has_mask_N, located(batch, "t."), ref)

    def _gathered(self, rows: PartRows) -> Gathered:
        """The token columns of ``rows`` from the spills (heads only when ``k`` is set)."""
        columns: list[str | tuple[str, ...]] = [INPUT_IDS, "completion_logprobs", *mask_column(rows.has_mask_N)]
        traces = self.spills.traces.flat_at(rows.traces, columns)
        nested = None
        if self.k is not None:
            nested = self.spills.traces.take_at(rows.traces["spill_row"], list(HEAD_COLUMNS))
        ref = None
        if self.spills.ref is not None and rows.ref is not None:
            ref = self.spills.ref.flat_at(rows.ref, ["ref_logprobs"])["ref_logprobs"]
        return Gathered(traces, nested, ref)

    def _assembled(self, rows: PartRows) -> Assembled:
        """``rows`` (one row group's) gathered and assembled into a ``SHARD`` table."""
        gathered = self._gathered(rows)
        if rows.units_N is None:
            return assemble_shard(gathered, rows.meta, rows.scores, self.options, self.k)
        merged = assemble_merged_shard(gathered, rows.meta, rows.units_N, rows.scores, self.options, self.k)
        kl_sum, kl_n, capped = kl_totals(merged.table, self.options.kl_estimator)
        unsafe = (merged.unsafe_tokens, merged.unsafe_rows)
        return Assembled(merged.table, kl_sum, kl_n, *unsafe, merged.rows.unmerged_tokens, kl_capped=capped)

    def write(self, s: int, rows: PartRows) -> PartWritten:
        """Write part ``s`` of ``rows`` to ``<folder>/<name>.tmp`` (not fsynced, not renamed:
        :func:`prl.shards.publish.publish_file` does both), one row group at a time
        (:func:`prl.shards.rowgroups.row_groups`): each row group's token columns are gathered from the spills,
        assembled and written before the next, so a part holds one row group in memory, not all of it. The
        counts add the row groups' in order."""
        name = part_name(s)
        tally = _Tally()
        with ShardWriter(os.path.join(self.folder, f"{name}.tmp")) as out:
            for r0, r1 in row_groups(rows.meta["group_id"], rows.tokens_N(), rowgroups.ROW_GROUP_TOKENS):
                assembled = self._assembled(rows.slice(r0, r1))
                out.write(assembled.table)
                tally.add(assembled)
                del assembled
            size, sha256 = out.close()
        groups = int(rows.meta["group_id"].n_unique())
        entry = FileEntry(name, tally.rows, size, sha256, groups, tally.tokens, tally.completion_tokens)
        return tally.part(s, entry)

    def write_published(self, parts: list[int]) -> list[PartWritten]:
        """An engine's task: gather, assemble and write each of ``parts``, fsync it and rename it into place."""
        out = []
        for s in parts:
            written = self.write(s, self.gather(s))
            path = os.path.join(self.folder, written.entry.file)
            publish_file(f"{path}.tmp", path)
            out.append(written)
        return out


__all__ = ["PartJob", "PartRows", "PartWritten", "Spills", "part_name"]
