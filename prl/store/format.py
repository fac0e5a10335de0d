"""The store's format version: which layout of tables and columns a store holds, and so which prl may use it.

A store records its format in ``STORE/_store.json`` (``{"format": N}``), written before its first table is
created: locally as a hidden temporary file renamed into place, on S3 as one PUT, so a reader sees the whole
object or none; two creators write the same body. A store with tables and no marker is of format 1 (stores
written before the format was recorded). Every command checks the format when it opens the store
(:func:`prl.store.resolve.open_store`) and refuses another one with exit 2: an older store names the one
command that upgrades it (``prl maintain --upgrade``, :func:`prl.maintain.upgrade`), a newer one says
it was written by a newer prl.

Formats: 1, the tables as first written (columns added since missing from older tables, side-table rows
without ``event_id``); 2, every table with every column of :data:`prl.schema.TABLES` and every side-table
row with its ``event_id``.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import TYPE_CHECKING

from deltalake import DeltaTable

from prl.errors import RetryableIOError, UsageError
from prl.schema import TABLES
from prl.store.s3lock import log_object, put_object

if TYPE_CHECKING:
    from prl.store.tables import Store

STORE_FORMAT = 2
"""The format this prl reads and writes."""
MARKER = "_store.json"
"""The object at the store's root that records its format."""

__all__ = ["MARKER", "STORE_FORMAT", "check_format", "mark_new", "outdated", "recorded_format", "store_format"]


def recorded_format(store: Store) -> int | None:
    """The format the store's marker records; None when there is no marker. A marker that is not
    ``{"format": <int>}`` raises :class:`UsageError`."""
    try:
        if store.uri.startswith("s3://"):
            body = log_object(store.uri, MARKER)
        else:
            try:
                with open(os.path.join(store.uri, MARKER), "rb") as fh:
                    body = fh.read()
            except FileNotFoundError:
                body = None
    except OSError as exc:
        raise RetryableIOError(f"cannot read {MARKER} of store {store.uri}: {exc}") from exc
    if body is None:
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    found = obj.get("format") if isinstance(obj, dict) else None
    if type(found) is not int or found < 1:
        raise UsageError(f'store {store.uri}: {MARKER} is damaged (not {{"format": <version>}}): {body[:80]!r}')
    return found


def has_tables(store: Store) -> bool:
    """Whether the store holds any of prl's tables."""
    if not store.uri.startswith("s3://"):
        return any(os.path.isdir(os.path.join(store.uri, name, "_delta_log")) for name in TABLES)
    try:
        return any(DeltaTable.is_deltatable(store.table_uri(name), storage_options=store.options) for name in TABLES)
    except OSError as exc:
        raise RetryableIOError(f"cannot read store {store.uri}: {exc}") from exc


def store_format(store: Store) -> int | None:
    """The store's format: its marker's, else 1 when it holds tables; None for a location with neither (a new
    store, created at :data:`STORE_FORMAT`)."""
    recorded = recorded_format(store)
    if recorded is not None:
        return recorded
    if not has_tables(store):
        return None
    # A creator writes the marker before its first table: read again, after the tables were seen, so that a
    # store created meanwhile is not taken for format 1.
    recorded = recorded_format(store)
    return 1 if recorded is None else recorded


def outdated(uri: str, found: int) -> UsageError:
    """The error for a store of format ``found``, not :data:`STORE_FORMAT`."""
    if found < STORE_FORMAT:
        return UsageError(
            f"store {uri} is of format {found}, written by an older prl; this prl uses format {STORE_FORMAT}: "
            f"upgrade it once with `prl maintain --upgrade --store {uri}`"
        )
    return UsageError(
        f"store {uri} is of format {found}, written by a newer prl; this prl uses format {STORE_FORMAT}: "
        "use that prl (or a newer one) with it"
    )


def check_format(store: Store) -> None:
    """Raise :class:`UsageError` (exit 2) unless the store is of :data:`STORE_FORMAT` or new."""
    found = store_format(store)
    if found is not None and found != STORE_FORMAT:
        raise outdated(store.uri, found)


def mark_new(store: Store) -> None:
    """Record :data:`STORE_FORMAT` in a store about to get a table, unless it records a format already; a store
    with tables and no marker (format 1) is refused instead. Called before a table is created."""
    found = store_format(store)
    if found is None:
        write_marker(store, STORE_FORMAT)
    elif found != STORE_FORMAT:
        raise outdated(store.uri, found)


def write_marker(store: Store, version: int) -> None:
    """Write the marker recording ``version`` (atomically: a reader sees the whole body or the one before)."""
    body = json.dumps({"format": version}).encode() + b"\n"
    try:
        if store.uri.startswith("s3://"):
            put_object(store.uri, MARKER, body)
            return
        os.makedirs(store.uri, exist_ok=True)
        staged = os.path.join(store.uri, f".{MARKER}.{uuid.uuid4().hex}")
        try:
            with open(staged, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(staged, os.path.join(store.uri, MARKER))
        finally:
            if os.path.exists(staged):
                os.remove(staged)
    except OSError as exc:
        raise RetryableIOError(f"cannot write {MARKER} of store {store.uri}: {exc}") from exc
