"""The source ledger of a trace ingest: one entry per file read, in the metadata of the traces commit."""

from __future__ import annotations

from typing import Any

from prl.ingestion.result import FileReport
from prl.io.sources import LineReader, SourceFile


def ledger_entry(
    src: SourceFile, reader: LineReader, fmt: str | None, report: FileReport, held_tail: int = 0
) -> dict[str, Any]:
    """The file's ledger entry: ``bytes_consumed`` excludes what was left for a later run (an unfinished last
    line, and an SSE stream still open where the file ends); ``complete`` is whether nothing was."""
    report.sha256 = reader.sha256 or None
    held = reader.held_back + held_tail
    report.held_back_bytes = held
    return {
        "uri": src.uri,
        "size": src.size,
        "mtime_ns": src.mtime_ns,
        "sha256": reader.sha256,
        "format": fmt,
        "records": report.records,
        "samples": report.samples,
        "bytes_consumed": reader.bytes_read - held,
        "complete": not held,
    }


__all__ = ["ledger_entry"]
