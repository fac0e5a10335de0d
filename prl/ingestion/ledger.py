"""The source ledger of a trace ingest: one entry per file read, in the metadata of the traces commit."""

from __future__ import annotations

from typing import Any

from prl.ingestion.result import FileReport
from prl.ingestion.resume import ResumePoint
from prl.io.sources import LineReader, SourceFile


def ledger_entry(
    src: SourceFile,
    reader: LineReader,
    fmt: str | None,
    report: FileReport,
    held_tail: int = 0,
    resume: ResumePoint | None = None,
) -> dict[str, Any]:
    """The file's ledger entry: ``bytes_consumed`` (from the file's start) excludes what was left for a later
    run (an unfinished last line, and an SSE stream still open where the file ends); ``complete`` is whether
    nothing was. ``read_from`` is the byte this run began at (0, or where an earlier run stopped) and
    ``sha256`` is of the bytes from there on; ``resume``, where a later run may continue (see
    :mod:`prl.ingestion.resume`)."""
    report.sha256 = reader.sha256 or None
    held = reader.held_back + held_tail
    report.held_back_bytes = held
    report.bytes_read = reader.bytes_read
    report.resumed_from = reader.start
    entry = {
        "uri": src.uri,
        "size": src.size,
        "mtime_ns": src.mtime_ns,
        "sha256": reader.sha256,
        "read_from": reader.start,
        "format": fmt,
        "records": report.records,
        "samples": report.samples,
        "bytes_consumed": reader.start + reader.bytes_read - held,
        "complete": not held,
    }
    if resume is not None:
        entry["resume"] = resume.to_json()
    return entry


__all__ = ["ledger_entry"]
