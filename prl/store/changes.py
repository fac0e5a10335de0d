"""What a table's commits added: data files read from the Delta log, for work proportional to new data.

A Delta commit ``N`` is the file ``_delta_log/<N:020>.json``, one action per line; its ``add`` actions with
``dataChange: true`` are the files that brought new rows. Maintenance rewrites (compaction) add files with
``dataChange: false`` holding rows that were already there; they are left out, so the files listed for a
range of versions hold each new row exactly once.
"""

from __future__ import annotations

import json
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds

from prl.schema import TABLES
from prl.store.tables import Store


def added_files(store: Store, table: str, after: int, upto: int) -> list[str] | None:
    """Paths (relative to the table folder) of the data files that commits ``after + 1 .. upto`` of ``table``
    added with new rows, in commit order. None when a commit file of the range is gone (the log was cleaned
    up past it): the caller must fall back to the whole snapshot."""
    paths: list[str] = []
    for version in range(after + 1, upto + 1):
        body = store.log_entry(table, version)
        if body is None:
            return None
        for line in body.splitlines():
            if b'"add"' not in line:
                continue
            add = json.loads(line).get("add")
            if add is not None and add.get("dataChange", True):
                paths.append(unquote(add["path"]))
    return paths


def snapshot_files(store: Store, table: str, version: int) -> list[str]:
    """Paths (relative to the table folder) of every data file of ``table`` at ``version`` (the snapshot
    :meth:`Store.version` opened, when it found that version: no request)."""
    paths = store.read_at(table, version, lambda opened: pa.table(opened.get_add_actions()).column("path").to_pylist())
    return [] if paths is None else [unquote(p) for p in paths]


def files_dataset(store: Store, table: str, paths: list[str]) -> ds.Dataset:
    """A pyarrow dataset over some data files of ``table`` (paths relative to the table folder), read as the
    store's streaming scans read (:attr:`Store.scan_options`). A file of the snapshot the store holds is read
    at the size its log gives (:meth:`Store.known_sizes`: on S3 no HEAD for it); a missing file fails the scan."""
    root = store.table_path(table)
    sizes = store.known_sizes(table)
    parquet = ds.ParquetFileFormat(default_fragment_scan_options=store.scan_options)
    fragments = [parquet.make_fragment(f"{root}/{p}", filesystem=store.fs, file_size=sizes.get(p)) for p in paths]
    return ds.FileSystemDataset(fragments, TABLES[table], parquet, store.fs)


def snapshot_turn_files(store: Store, version: int) -> tuple[list[str], dict[str, int]]:
    """``(files, rows)``: the data files of ``traces`` at ``version`` oldest first (by the log's modification
    time, then path; paths relative to the table folder, as :func:`prl.store.changes.snapshot_files` gives them),
    and the rows of each from the log's statistics (files without a count left out)."""
    actions = store.read_at(
        "traces",
        version,
        lambda opened: pa.table(opened.get_add_actions()).select(["path", "num_records", "modification_time"]),
    )
    if actions is None:
        return [], {}
    entries = sorted(
        zip(
            actions["modification_time"].cast(pa.int64()).to_pylist(),
            [unquote(p) for p in actions["path"].to_pylist()],
            actions["num_records"].to_pylist(),
            strict=True,
        ),
        key=lambda e: (e[0] if e[0] is not None else 0, e[1]),
    )
    return [path for _, path, _ in entries], {path: int(n) for _, path, n in entries if n is not None}
