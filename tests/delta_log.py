"""Commit metadata read straight from a table's Delta log with deltalake, as any Delta reader sees it."""

from __future__ import annotations

import json
from typing import Any

from deltalake import DeltaTable

from prl.store.tables import Store


def commit_infos(store: Store, table: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The table's commit infos, newest first, with prl's ``prl.*`` values decoded from their JSON."""
    history = DeltaTable(store.table_uri(table), storage_options=store.options or None).history(limit)
    return [{k: json.loads(v) if k.startswith("prl.") else v for k, v in entry.items()} for entry in history]
