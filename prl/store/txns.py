"""Every Delta ``txn`` of a table in one pass over its log, for runs that look up many app ids.

A run asks for the txn of each of its source files (``prl.source:<identity>``: consumed whole) and of each
file's resume point (``prl.resume:<digest>``). delta-rs answers ``transaction_version`` by replaying the log
since the checkpoint on every call, so a run over F files read the log F times over (on S3, a request per
commit and file). :func:`transactions` reads it once: the ``txn`` column of the checkpoint that
``_last_checkpoint`` names, then the ``txn`` actions of every commit after it up to the table's version, a later
action of an app id replacing an earlier one, as Delta's log replay does.

Where the log is not as this reader expects (a checkpoint newer than the snapshot, one in parts or of another
kind, a commit file missing, a txn retention setting), it answers nothing itself and every lookup is asked of
delta-rs, so an answer is always the one ``transaction_version`` gives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.parquet as pq
from deltalake import DeltaTable

from prl.errors import RetryableIOError
from prl.store.tables import Store, describe_error

RETENTION_KEY = "delta.setTransactionRetentionDuration"
"""A table property under which Delta drops old txns from a snapshot: left to delta-rs."""


@dataclass(frozen=True)
class Transactions:
    """The txns of one table version: ``lookup(app_id)`` is its version, None when the app id never committed."""

    table_version: int | None
    """The table version they are those of (None: the table does not exist)."""
    versions: dict[str, int] | None
    """app id → version, read from the log; None when the log was left to delta-rs."""
    ask: Callable[[str], int | None]
    """delta-rs's own lookup, used when ``versions`` is None."""

    def lookup(self, app_id: str) -> int | None:
        if self.versions is None:
            return self.ask(app_id)
        return self.versions.get(app_id)


def transactions(store: Store, name: str, table: DeltaTable | None) -> Transactions:
    """The txns of ``table`` (table ``name`` of ``store``, at the version it was opened or last brought to)."""
    if table is None:
        return Transactions(None, {}, lambda _: None)
    version = table.version()
    try:
        versions = None if RETENTION_KEY in table.metadata().configuration else _read(store, name, version)
    except OSError as exc:
        raise RetryableIOError(f"reading the log of {name!r} in {store.uri} failed: {describe_error(exc)}") from exc
    return Transactions(version, versions, table.transaction_version)


def _read(store: Store, name: str, version: int) -> dict[str, int] | None:
    """Every txn of the log up to ``version`` (app id → version), or None where the log is not as this reader
    expects (no usable checkpoint, a missing commit, a checkpoint or commit it cannot read): delta-rs answers."""
    try:
        return _read_log(store, name, version)
    except (ValueError, KeyError, TypeError, AttributeError):  # a damaged or unexpected log: delta-rs's to judge
        return None


def _read_log(store: Store, name: str, version: int) -> dict[str, int] | None:
    found: dict[str, int] = {}
    start = 0
    body = store.log_file(name, "_last_checkpoint")
    if body is not None:
        last = json.loads(body)
        checkpoint = last.get("version")
        if not isinstance(checkpoint, int) or checkpoint > version or last.get("parts") or "v2Checkpoint" in last:
            return None
        path = f"{store.table_path(name)}/_delta_log/{checkpoint:020d}.checkpoint.parquet"
        try:
            txn = pq.read_table(path, columns=["txn"], filesystem=store.fs).column("txn").to_pylist()
        except FileNotFoundError:
            return None
        for action in txn:
            if action is not None:
                found[action["appId"]] = int(action["version"])
        start = checkpoint + 1
    for commit in range(start, version + 1):
        entry = store.log_entry(name, commit)
        if entry is None:
            return None
        for line in entry.splitlines():
            if b'"txn"' in line:
                action = json.loads(line).get("txn")
                if action is not None:
                    found[action["appId"]] = int(action["version"])
    return found


__all__ = ["Transactions", "transactions"]
