"""Which traces rows a check run still has to look at, answered from the Delta logs in time proportional to
what is new.

A run that checks everything it was given ends with a ``checks`` commit carrying a Delta ``txn``:
``prl.checks:<fingerprint>:<sample rate>:<traces table id>`` → the traces version it covered, and the running
total of rows checked under that key (commit metadata ``prl.checked_total``). The next run then scans only the
traces files committed after that version (:func:`prl.store.changes.added_files`), and leaves out the samples
that runs killed after the watermark already checked: the rows of the ``checks`` files committed after the
watermark commit, found in the log too. Without a watermark (a first run, another sample rate, a re-created
traces table, a log cleaned past the watermark) the run falls back to the whole snapshot and an anti-join
against every verdict of the fingerprint, as a first run does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from prl.store.changes import added_files, files_dataset
from prl.store.tables import Store

WATERMARK_SEARCH = 10_000
"""Newest checks commits searched for the watermark commit before falling back to a full scan."""


@dataclass
class Progress:
    """What a run over traces version ``traces_version`` must do for one fingerprint and sample rate.

    ``paths``: traces files to scan (relative to the table folder), None for the whole snapshot;
    ``done``: sample IDs among them already checked (to anti-join), None when none; ``previously``: rows
    checked under this key before (the summary's "already checked"); ``covered``: the traces version the
    watermark covers, None without one.
    """

    app_id: str
    traces_version: int
    paths: list[str] | None
    done: pa.Array | None
    previously: int
    covered: int | None

    @property
    def up_to_date(self) -> bool:
        return self.covered is not None and self.covered >= self.traces_version and self.done is None


def app_id(store: Store, fingerprint: str, sample_rate: float, traces_version: int | None = None) -> str:
    """The watermark's txn app id. Its traces table id is read from the traces table at ``traces_version`` (the
    snapshot the run checks, which :meth:`Store.version` opened: no request), else at its latest version."""
    if traces_version is None:
        traces = store.latest("traces")
        table_id = None if traces is None else str(traces.metadata().id)
    else:
        table_id = store.read_at("traces", traces_version, lambda table: str(table.metadata().id))
    table_id = table_id or ""
    return f"prl.checks:{fingerprint}:{sample_rate!r}:{table_id}"


def progress(store: Store, fingerprint: str, sample_rate: float, traces_version: int) -> Progress:
    """Where checking ``fingerprint`` at ``sample_rate`` stands against ``traces_version``.

    The checks table is the run's view (:meth:`Store.latest`, opened here once and kept for the run's commits):
    as fresh as an open, so every watermark and verdict committed before it counts."""
    key = app_id(store, fingerprint, sample_rate, traces_version)
    checks = store.latest("checks")
    covered = None if checks is None else checks.transaction_version(key)
    if checks is not None and covered is not None:
        found = _watermark_commit(store, key, checks.version())
        if found is not None:
            version, total = found
            paths = added_files(store, "traces", covered, traces_version)
            later = added_files(store, "checks", version, checks.version())
            if paths is not None and later is not None:
                done = _fingerprint_ids(store, later, fingerprint)
                return Progress(key, traces_version, paths, done, total + (0 if done is None else len(done)), covered)
    done = _all_ids(store, fingerprint)
    return Progress(key, traces_version, None, done, 0 if done is None else len(done), None)


def _watermark_commit(store: Store, key: str, latest: int) -> tuple[int, int] | None:
    """(version, checked total) of the newest checks commit that set ``key``'s txn; None if not in the log."""
    needle = json.dumps(key).encode()
    for version in range(latest, max(-1, latest - WATERMARK_SEARCH), -1):
        body = store.log_entry("checks", version)
        if body is None:
            return None
        if needle not in body:
            continue
        total = 0
        for line in body.splitlines():
            info = json.loads(line).get("commitInfo") if b'"commitInfo"' in line else None
            if info is not None and "prl.checked_total" in info:
                total = int(json.loads(info["prl.checked_total"]))
        return version, total
    return None


def _fingerprint_ids(store: Store, paths: list[str], fingerprint: str) -> pa.Array | None:
    if not paths:
        return None
    table = files_dataset(store, "checks", paths).to_table(
        columns=["sample_id"], filter=pc.field("tokenizer_fingerprint") == fingerprint
    )
    return pc.unique(table.column("sample_id").combine_chunks()) if table.num_rows else None


def _all_ids(store: Store, fingerprint: str) -> pa.Array | None:
    done = store.read("checks", columns=["sample_id"], filter=pc.field("tokenizer_fingerprint") == fingerprint)
    return pc.unique(done.column("sample_id").combine_chunks()) if done.num_rows else None


__all__ = ["Progress", "app_id", "progress"]
