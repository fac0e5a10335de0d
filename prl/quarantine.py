"""Quarantine rows: a record that was read and not kept, with why (table ``quarantine``); every step that reads
records makes them the same way."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from prl.formats.base import Quarantined
from prl.redact import redact
from prl.schema import QUARANTINE, RAW_LIMIT
from prl.store.tables import Store


def quarantine_row(
    uri: str,
    line: int,
    fmt: str | None,
    raw: bytes,
    q: Quarantined,
    now_ms: int,
    sample_id: str | None = None,
    table: str = "traces",
) -> dict[str, Any]:
    """One quarantine row; its id is derived from the record's location, content and reason, so re-reading
    the same record never quarantines it twice. Every text it holds is valid UTF-8 (the columns are strings):
    ``raw`` is the record's text with each byte that is not UTF-8 written as ``\\xNN`` (JSON has no ``\\x``
    escape, so the bytes can be told apart and restored), and a lone UTF-16 surrogate in any other text (a
    sample ID, a path) as ``\\udXXX``. ``raw`` (its first :data:`RAW_LIMIT` characters) and ``message`` keep no
    credential (:func:`prl.redact.redact`: header values such as ``Authorization``, URL userinfo); the id is the
    digest of the line as read."""
    digest = hashlib.sha256(f"{table}|{uri}|{line}|{q.choice_index}|{q.reason}|".encode("utf-8", "surrogatepass"))
    digest.update(raw)
    text = raw.decode("utf-8", errors="backslashreplace")
    return {
        "quarantine_id": digest.hexdigest()[:40],
        "table": table,
        "source_uri": unicode_text(uri),
        "source_line": line,
        "source_format": fmt,
        "sample_id": None if sample_id is None else unicode_text(sample_id),
        "reason": q.reason,
        "message": redact(unicode_text(q.message[:1000])),
        "raw": redact(text[:RAW_LIMIT]),
        "raw_truncated": len(text) > RAW_LIMIT,
        "quarantined_at": now_ms,
    }


def unicode_text(text: str) -> str:
    """``text`` as valid Unicode: a lone surrogate (``"\\udfff"``, which no UTF-8 column can hold) written as its
    ``\\udfff`` escape; any other text is returned as it is."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def new_quarantine_rows(store: Store, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose ``quarantine_id`` is not in the table yet (and not repeated within ``rows``)."""
    unique = {row["quarantine_id"]: row for row in rows}
    existing = store.read("quarantine", columns=["quarantine_id"], filter=ds.field("quarantine_id").isin(list(unique)))
    for qid in existing.column("quarantine_id").to_pylist():
        unique.pop(qid, None)
    return list(unique.values())


def quarantine_batches(rows: list[dict[str, Any]], size: int = 10_000) -> Iterable[pa.RecordBatch]:
    for start in range(0, len(rows), size):
        yield pa.RecordBatch.from_pylist(rows[start : start + size], schema=QUARANTINE)
