"""One part of a shard set: gather its rows from the spills, assemble its table and write it (one file, hashed).

:class:`PartJob` holds everything the parts of one build share (the spills, the file of the shipped rows' plan
values, scores and places in the spills, :class:`prl.shards.shiprows.ShipRows`, and the options);
:meth:`PartJob.write` makes part ``s`` and returns its
:class:`PartWritten` (manifest entry and counts), the table itself already on disk. Every value in a part
depends only on its own samples, so the bytes do not depend on which thread, process or machine writes it: the
local engine runs :meth:`PartJob.write` on threads (:mod:`prl.shards.build`), the Ray engine runs
:meth:`PartJob.write_published` in Ray tasks (:mod:`prl.engines.ray.shards`), and both yield the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow.compute as pc

from prl.shards.assemble import Assembled, Gathered, assemble_shard
from prl.shards.gather import INPUT_IDS, mask_column
from prl.shards.manifest import FileEntry
from prl.shards.merge_build import assemble_merged_shard, kl_totals
from prl.shards.options import ShardOptions
from prl.shards.publish import publish_file
from prl.shards.scan import HEAD_COLUMNS
from prl.shards.scores import Scores
from prl.shards.shiprows import ShipRows, located, part_meta, part_scores
from prl.shards.spill import ScanSpill
from prl.shards.writer import write_shard


@dataclass
class Spills:
    """The build's spill files and their folder (removed once every shard has been gathered)."""

    traces: ScanSpill
    ref: ScanSpill | None
    folder: str


@dataclass
class PartRows:
    """Part ``s``'s rows as gathered: their token columns from the spills, their plan values
    (:func:`prl.shards.shiprows.part_meta`), their scores and with ``merge_turns`` their merged units
    (:func:`prl.shards.shiprows.part_scores`)."""

    gathered: Gathered
    meta: pl.DataFrame
    scores: Scores
    units_N: np.ndarray | None


@dataclass(frozen=True)
class PartWritten:
    """One part written: its manifest entry, the sum (float64) and count of its per-token KL values, the
    loss-mask positions (and samples) taken out because a logprob there was null or not finite, and with
    ``merge_turns`` the tokens its turns hold one row each."""

    shard: int
    entry: FileEntry
    kl_sum: float
    kl_tokens: int
    unsafe_tokens: int
    unsafe_samples: int
    unmerged_tokens: int = 0

    def to_row(self) -> dict[str, Any]:
        """Plain scalars (what a Ray Data row carries back to the driver)."""
        counts = {"kl_sum": self.kl_sum, "kl_tokens": self.kl_tokens, "unsafe_tokens": self.unsafe_tokens}
        samples = {"unsafe_samples": self.unsafe_samples, "unmerged_tokens": self.unmerged_tokens}
        return {"shard": self.shard, **self.entry.to_json(), **counts, **samples}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> PartWritten:
        entry = FileEntry(
            file=str(row["file"]),
            rows=int(row["rows"]),
            bytes=int(row["bytes"]),
            sha256=str(row["sha256"]),
            groups=int(row["groups"]),
            tokens=int(row["tokens"]),
            completion_tokens=int(row["completion_tokens"]),
        )
        return cls(
            int(row["shard"]),
            entry,
            float(row["kl_sum"]),
            int(row["kl_tokens"]),
            int(row["unsafe_tokens"]),
            int(row["unsafe_samples"]),
            int(row["unmerged_tokens"]),
        )


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
        """Part ``s``'s rows: its batch of ``rows`` and what it locates in the spills (heads only when ``k`` is
        set)."""
        batch = self.rows.read(s)
        located_t = located(batch, "t.")
        has_mask = batch.column("has_mask").to_numpy(zero_copy_only=False)
        traces = self.spills.traces.flat_at(located_t, [INPUT_IDS, "completion_logprobs", *mask_column(has_mask)])
        nested = None
        if self.k is not None:
            nested = self.spills.traces.take_at(located_t["spill_row"], list(HEAD_COLUMNS))
        ref = None
        if self.spills.ref is not None:
            ref = self.spills.ref.flat_at(located(batch, "r."), ["ref_logprobs"])["ref_logprobs"]
        scores, units_N = part_scores(batch, self.mean_d)
        return PartRows(Gathered(traces, nested, ref), part_meta(batch), scores, units_N)

    def write(self, s: int, rows: PartRows) -> PartWritten:
        """Assemble part ``s`` from its gathered ``rows`` and write it to ``<folder>/<name>.tmp`` (not fsynced,
        not renamed: :func:`prl.shards.publish.publish_file` does both)."""
        meta = rows.meta
        if rows.units_N is None:
            assembled = assemble_shard(rows.gathered, meta, rows.scores, self.options, self.k)
        else:
            merged = assemble_merged_shard(rows.gathered, meta, rows.units_N, rows.scores, self.options, self.k)
            kl_sum, kl_n = kl_totals(merged.table)
            unsafe = (merged.unsafe_tokens, merged.unsafe_rows)
            assembled = Assembled(merged.table, kl_sum, kl_n, *unsafe, merged.rows.unmerged_tokens)
        del rows
        shard = assembled.table
        name = part_name(s)
        size, sha256 = write_shard(shard, os.path.join(self.folder, f"{name}.tmp"))
        entry = FileEntry(
            file=name,
            rows=shard.num_rows,
            bytes=size,
            sha256=sha256,
            groups=int(meta["group_id"].n_unique()),
            tokens=int(pc.sum(pc.list_value_length(shard["input_ids"])).as_py() or 0),
            completion_tokens=int(pc.sum(pc.list_value_length(shard["loss_mask"])).as_py() or 0),
        )
        a = assembled
        return PartWritten(s, entry, a.kl_sum, a.kl_tokens, a.unsafe_tokens, a.unsafe_samples, a.unmerged_tokens)

    def write_published(self, s: int) -> dict[str, Any]:
        """Gather, assemble and write part ``s``, fsync it and rename it into place; its :meth:`PartWritten.to_row`."""
        written = self.write(s, self.gather(s))
        path = os.path.join(self.folder, written.entry.file)
        publish_file(f"{path}.tmp", path)
        return written.to_row()


__all__ = ["PartJob", "PartRows", "PartWritten", "Spills", "part_name"]
