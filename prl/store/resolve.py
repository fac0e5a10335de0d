"""Is this path a store? Every command answers before it takes a lock or writes anything.

A *store* is a folder or ``s3://`` prefix holding at least one of prl's Delta tables (``<table>/_delta_log``).
Commands that read a store (``check-tokens``, ``build-shards``, ``inspect``, ``prl run`` without an ingest step)
refuse anything else with exit 2 and create nothing (no ``STORE/_locks``): a mistyped ``--store``, an empty
folder, a shard set folder given as the store.

``ingest`` (traces, rewards or reference logprobs) may also start a new store, but only where that cannot bury
unrelated files: at a path that does not exist, in an empty folder, or in a folder that holds nothing but prl's
own entries (table folders and ``_locks``: a first ingest killed before its first commit leaves exactly that).
Any other folder (a home directory, a shard folder, a folder of trace files) is refused with exit 2. On S3 a new
store may start at any prefix (objects are not listed: a writer may lack the right to).

A local store that would be written on a read-only filesystem, or in a folder the process may not write, is
refused with exit 5 (:class:`RetryableIOError`, as other permission problems) and a message naming that cause.
"""

from __future__ import annotations

import os

from deltalake import DeltaTable

from prl.errors import RetryableIOError, UsageError
from prl.schema import TABLES
from prl.store.format import MARKER, check_format
from prl.store.tables import Store, describe_error, is_remote

LOCKS_FOLDER = "_locks"
STORE_ENTRIES = frozenset({*TABLES, LOCKS_FOLDER, "_index", MARKER})
"""Top-level names prl itself creates in a store."""
SHARD_MARKERS = ("manifest.json", "_index.json")
TABLE_ORDER = ("traces", "checks", "rewards", "ref_logprobs", "quarantine")
"""The order tables are looked for in a remote store: the likeliest first."""


def open_store(store: Store | str, *, create: bool = False, writing: bool = True, upgrading: bool = False) -> Store:
    """The :class:`Store` at ``store`` (a Store or its URI), after checking that it is one, of this prl's format
    (:mod:`prl.store.format`; ``upgrading``: of any format, for the upgrade itself).

    ``create``: the caller may start a new store there (see the module docstring). ``writing``: the caller will
    write (not a dry run), so a read-only location is refused up front. Raises :class:`UsageError` (exit 2) for
    a path that is not a store or a store of another format, :class:`RetryableIOError` (exit 5) for an
    unwritable one or a listing that fails.
    """
    uri = store.uri if isinstance(store, Store) else store
    if is_remote(uri) and not uri.startswith("s3://"):
        raise UsageError(f"store {uri}: only local folders and s3:// prefixes are stores")
    if not is_remote(uri):
        _check_local(os.path.abspath(uri.removeprefix("file://")), create, writing)
    resolved = store if isinstance(store, Store) else Store(uri)
    if is_remote(uri):
        _check_remote(resolved, create)
    if not upgrading:
        check_format(resolved)
    return resolved


def _not_a_store(uri: str, why: str, create: bool) -> UsageError:
    hint = (
        "ingest starts a new store only at a path that does not exist or an empty folder"
        if create
        else "ingest traces into it first, or check --store"
    )
    return UsageError(f"{uri} is not a prl store: {why}; {hint}")


def _check_local(path: str, create: bool, writing: bool) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise _not_a_store(path, "it is a file, not a folder", create)
    if os.path.isdir(path):
        if any(os.path.isdir(os.path.join(path, name, "_delta_log")) for name in TABLES):
            if writing:
                _check_writable(path)
            return
        entries = [name for name in os.listdir(path) if not name.startswith(".")]
        if any(name in SHARD_MARKERS or name.startswith("part-") for name in entries):
            raise _not_a_store(path, "it holds a shard set (manifest.json / part files), not Delta tables", create)
        if not create:
            raise _not_a_store(path, "it holds no prl table (" + ", ".join(sorted(TABLES)) + ")", create)
        foreign = sorted(name for name in entries if name not in STORE_ENTRIES)
        if foreign:
            shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
            raise _not_a_store(path, f"the folder is not empty ({shown})", create)
    elif not create:
        raise _not_a_store(path, "no such folder", create)
    else:
        parent = os.path.dirname(path)
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise _not_a_store(path, f"{parent} is a file", create)
    if writing:
        _check_writable(path)


def _check_writable(path: str) -> None:
    """Refuse a location on a read-only filesystem, or one this process may not write, naming that cause."""
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:  # pragma: no cover - statvfs is available on every POSIX system prl runs on
        read_only = False
    if read_only:
        raise RetryableIOError(
            f"store {path} is on a read-only filesystem ({existing}): nothing can be written there; "
            "--dry-run reads and checks without writing"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RetryableIOError(f"store {path}: permission denied (this process may not write in {existing})")


def _check_remote(store: Store, create: bool) -> None:
    """An ``s3://`` store is a prefix with a Delta table in it (asked through delta-rs, which reads the endpoint
    and credentials from the standard environment). A new one may start at any prefix: objects there are not
    listed, since a writer may lack the right to list."""
    if create:
        return
    for name in TABLE_ORDER:
        try:
            if DeltaTable.is_deltatable(store.table_uri(name), storage_options=store.options or None):
                return
        except OSError as exc:
            raise RetryableIOError(f"cannot read store {store.uri}: {describe_error(exc)}") from exc
    raise _not_a_store(store.uri, "no prl table under that prefix", create)
