"""Reading a reward or reference JSONL file on from where an earlier run stopped, as trace files are
(:mod:`prl.ingestion.resume`).

The side table's ledger entry of a plain JSONL file carries ``resume``: a :class:`ResumePoint` (the end of the
whole lines consumed, the number of lines before it and the :class:`prl.io.prefix.PrefixDigest` of the bytes
before it; framing ``jsonl``, format option the table's name), and for rewards ``occurrences``: how often each
event content occurred before the point (:meth:`prl.event_ids.Occurrences.to_json`), so the identical
events after it are numbered on exactly as a read of the whole file numbers them, and their ``event_id`` is the
same. (Reference rows carry no occurrence: identical rows are one event.) A later run that finds the file at
least that long with the same first and last blocks reads on from the point; a rotated, truncated or rewritten
file, a compressed one, a CSV or Parquet file and an entry without a point are read from the start, for what
they hold now, the events read before recognised by content.

No point is recorded where a read of the whole file would number differently from a continued one: after an
unterminated last line that was read (a file that stopped changing without a final newline: the next run reads
that line again), or where the file holds more than :data:`MAX_OCCURRENCES` distinct events (so a ledger entry
stays small; such a file is read from its start, as before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prl.event_ids import Occurrences
from prl.ingestion.resume import ResumePoint, fresh_reader, point_after
from prl.io.prefix import PrefixWindow, matching_prefix
from prl.io.sources import LineReader, SourceFile

FRAMING = "jsonl"
MAX_OCCURRENCES = 100_000
"""Distinct reward events a file may hold for its ledger entry to carry their counts (2.7 MB of JSON at most)."""


@dataclass(frozen=True, slots=True)
class SideStart:
    """Where a side-table file is read from: its reader and the event counts before the reader's start."""

    reader: LineReader
    occurrences: Occurrences

    @property
    def resumed(self) -> bool:
        return self.reader.start > 0


def open_file(src: SourceFile, table: str, entry: dict[str, Any] | None, hold_partial: bool) -> SideStart:
    """A reader of ``src`` on from the point ``entry`` records when the file still begins with the bytes it
    consumed (and, for rewards, the counts it carries are readable); else from its start."""
    point = None if entry is None else ResumePoint.from_entry(entry)
    if entry is not None and point is not None and point.framing == FRAMING and point.format_option == table:
        occurrences = Occurrences.from_json(entry.get("occurrences")) if table == "rewards" else Occurrences()
        blocks = None if occurrences is None else matching_prefix(src.uri, src.size, point.prefix)
        if blocks is not None and occurrences is not None:
            window = PrefixWindow(point.prefix.block)
            window.seed(*blocks, point.offset)
            reader = LineReader(
                src, hold_partial=hold_partial, start=point.offset, first_line=point.lines + 1, window=window
            )
            return SideStart(reader, occurrences)
    return SideStart(fresh_reader(src, hold_partial), Occurrences())


def resume_entry(reader: LineReader, table: str, occurrences: Occurrences) -> dict[str, Any]:
    """What the file's ledger entry gets after the read: ``resume`` (and ``occurrences`` for rewards) where a
    later run may continue, else nothing."""
    if reader.unterminated_line is not None and not reader.held_back:
        return {}  # its last line was read without a newline: the next run reads it again
    if table == "rewards" and len(occurrences) > MAX_OCCURRENCES:
        return {}
    point = point_after(reader, FRAMING, table, None)
    if point is None:
        return {}
    entry: dict[str, Any] = {"resume": point.to_json()}
    if table == "rewards":
        entry["occurrences"] = occurrences.to_json()
    return entry


__all__ = ["FRAMING", "MAX_OCCURRENCES", "SideStart", "open_file", "resume_entry"]
