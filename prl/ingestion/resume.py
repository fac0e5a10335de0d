"""Continuing a plain source where an earlier run stopped, instead of reading it again from its start.

A ledger entry of a plain file may carry a ``resume`` point: the end of the whole lines consumed (where an SSE
stream left open begins, when one is), the number of lines before it, the :func:`prl.formats.guard.source_key`
of the file's first record (the salt of records without a request ID; null when none was read yet), the format
that framed the records and the run's ``--format``, and a :class:`prl.io.prefix.PrefixDigest` of the bytes
before it. A later run that finds the file at least that long, with the same first and last blocks there, reads
on from that byte with those line numbers and that salt: the records, sample IDs and quarantine rows are the
ones a read of the whole file gives. Anything else (an entry without the point, another ``--format``, a rotated,
truncated or rewritten file) is read from its start as before, content identity keeping out duplicates.

The newest entry carrying a point is found without replaying the history: its commit sets the Delta txn
:func:`app_id` of the file's URI to the version the commit was expected to get, and the log JSON of that version
(or, should another writer have taken it, of one of the next :data:`SEARCH`) holds the entry.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from prl.errors import RetryableIOError, UsageError
from prl.formats.base import Format
from prl.io.prefix import BLOCK_BYTES, PrefixDigest, PrefixWindow, matching_prefix
from prl.io.sources import LineReader, SourceFile
from prl.store.tables import Store
from prl.store.txns import Transactions

SEARCH = 64
"""Commits after the expected one searched for an entry whose commit got a later version than expected."""


def app_id(uri: str) -> str:
    """The Delta txn app id whose version names the commit holding ``uri``'s newest resume point."""
    return "prl.resume:" + hashlib.sha256(uri.encode()).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a later run continues a plain source (see the module docstring); :attr:`offset` is in bytes."""

    prefix: PrefixDigest
    lines: int
    first_record: str | None
    framing: str
    format_option: str

    @property
    def offset(self) -> int:
        return self.prefix.length

    def to_json(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "lines": self.lines,
            "first_record": self.first_record,
            "framing": self.framing,
            "format_option": self.format_option,
            "prefix": self.prefix.to_json(),
        }

    @classmethod
    def from_entry(cls, entry: Any) -> ResumePoint | None:
        """The point a ledger entry carries; None when it carries none (no point was taken: a compressed source, say) or a damaged one."""
        obj = entry.get("resume") if isinstance(entry, dict) else None
        if not isinstance(obj, dict):
            return None
        prefix = PrefixDigest.from_json(obj.get("prefix"))
        lines, first, framing, option = (obj.get(k) for k in ("lines", "first_record", "framing", "format_option"))
        if prefix is None or obj.get("offset") != prefix.length or type(lines) is not int or lines < 1:
            return None
        if not (first is None or isinstance(first, str)) or not isinstance(framing, str) or not isinstance(option, str):
            return None
        return cls(prefix, lines, first, framing, option)


def point_after(
    reader: LineReader,
    framing: str,
    format_option: str,
    first_record: str | None,
    open_stream_bytes: int = 0,
    open_stream_line: int = 0,
) -> ResumePoint | None:
    """The point after a read of a plain source: the end of its whole lines, or the first line of the SSE stream
    of ``open_stream_bytes`` still open there (at line ``open_stream_line``). None for a compressed source, or
    when the prefix's last block is no longer at hand (an open stream longer than the window)."""
    if reader.compression != "none" or reader.window is None:
        return None
    if open_stream_bytes:
        offset, lines = reader.start + reader.whole_bytes - open_stream_bytes, open_stream_line - 1
    else:
        offset, lines = reader.start + reader.whole_bytes, reader.next_line - 1
    digest = reader.window.digest(offset)
    if digest is None or lines < 1:
        return None
    return ResumePoint(digest, lines, first_record, framing, format_option)


@dataclass(frozen=True, slots=True)
class Continuation:
    """A point found still valid for a source: its format and the prefix's first and last blocks, as read."""

    point: ResumePoint
    fmt: Format
    head: bytes
    tail: bytes

    def reader(self, src: SourceFile, hold_partial: bool) -> LineReader:
        """A reader of ``src`` from the point on, its window seeded with the blocks checked."""
        window = PrefixWindow(self.point.prefix.block)
        window.seed(self.head, self.tail, self.point.offset)
        return LineReader(
            src, hold_partial=hold_partial, start=self.point.offset, first_line=self.point.lines + 1, window=window
        )


def fresh_reader(src: SourceFile, hold_partial: bool) -> LineReader:
    """A reader of ``src`` from its start that keeps what :func:`point_after` needs."""
    return LineReader(src, hold_partial=hold_partial, window=PrefixWindow(BLOCK_BYTES))


def continuation(src: SourceFile, point: ResumePoint, format_option: str) -> Continuation | None:
    """The point's continuation when ``src`` still begins with the bytes it names and is read with the same
    ``--format``; None otherwise (the source is read from its start)."""
    fmt = _framing(point, format_option)
    if fmt is None:
        return None
    blocks = matching_prefix(src.uri, src.size, point.prefix)
    return None if blocks is None else Continuation(point, fmt, *blocks)


def _framing(point: ResumePoint, format_option: str) -> Format | None:
    """The format a read from the start would frame with, as it was detected then."""
    if point.format_option != format_option:
        return None
    from prl.formats import registry  # every format: loaded by a trace ingest, not by the side tables' one

    try:
        if format_option != "auto":
            return registry.by_name(format_option)
        if point.framing == registry.PerRecord.name:
            return registry.PerRecord(None)
        return registry.per_record(registry.by_name(point.framing))
    except UsageError:  # a format this prl no longer has
        return None


def earlier_points(store: Store, txns: Transactions, uris: list[str]) -> dict[str, ResumePoint]:
    """The newest resume point recorded for each of ``uris`` that has one (``txns``: those of ``traces``)."""
    entries = earlier_entries(store, "traces", txns, uris)
    return {uri: point for uri, entry in entries.items() if (point := ResumePoint.from_entry(entry)) is not None}


def earlier_entries(store: Store, table: str, txns: Transactions, uris: list[str]) -> dict[str, dict[str, Any]]:
    """The newest ledger entry carrying a resume point for each of ``uris`` that has one, in the commits of
    ``table`` (``txns``: its txns at its latest version, :func:`prl.store.txns.transactions`)."""
    latest = txns.table_version
    if latest is None:
        return {}
    ledgers: dict[int, dict[str, Any]] = {}
    found: dict[str, dict[str, Any]] = {}
    for uri in uris:
        expected = txns.lookup(app_id(uri))
        if expected is None:
            continue
        for version in range(expected, min(latest, expected + SEARCH) + 1):
            if version not in ledgers:
                ledgers[version] = _ledger(store, table, version)
            entry = ledgers[version].get(uri)
            if entry is not None and ResumePoint.from_entry(entry) is not None:
                found[uri] = entry
                break
    return found


def _ledger(store: Store, table: str, version: int) -> dict[str, Any]:
    """The source ledger of ``table``'s commit of ``version``, by URI (empty when its log file is gone)."""
    try:
        body = store.log_entry(table, version)
    except OSError as exc:
        raise RetryableIOError(f"reading {store.table_uri(table)} log version {version} failed: {exc}") from exc
    if body is None:
        return {}
    for line in body.splitlines():
        if b'"commitInfo"' not in line:
            continue
        try:
            sources = json.loads(json.loads(line)["commitInfo"].get("prl.sources", "[]"))
        except (ValueError, TypeError, AttributeError, KeyError):
            return {}
        if isinstance(sources, list):
            return {e["uri"]: e for e in sources if isinstance(e, dict) and isinstance(e.get("uri"), str)}
    return {}


__all__ = [
    "Continuation",
    "ResumePoint",
    "app_id",
    "continuation",
    "earlier_entries",
    "earlier_points",
    "fresh_reader",
    "point_after",
]
