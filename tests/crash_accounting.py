"""The accounting after a finished rerun of the kill harness (:mod:`tests.crash_harness`): everything exactly once.

Each check raises :class:`AssertionError` naming what is wrong:

- traces: the rows are exactly the expected ``(sample_id, source_uri, source_line)``, each once; quarantine's
  traces rows exactly the expected bad ``(source_uri, source_line)``, each once;
- rewards: the rows are exactly the expected ``(source_line, sample_id, name, value)`` events, each once
  (``event_id`` unique); quarantine's rewards rows exactly the expected bad lines, each once;
- checks: exactly one verdict per expected sample;
- shards: every published set complete, its files exactly those its manifest names, verifying
  (:func:`prl.shards.verify.verify_set`; a set already verified whose files are unchanged is not read again,
  except in the final accounting, which reads and verifies every set), no sample in two sets, every expected sample shipped, no staging
  left (for an ``s3://`` OUT, none on local disk either), nothing visible without a manifest (an ``s3://`` OUT
  is mirrored to a local folder object by object first);
- no lock of the store left.

Each cycle's accounting reads a table's rows from the data files its snapshot names, only those committed since
the last accounting from the store (:func:`snapshot_rows`); the final accounting reads every table whole.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from prl.io.locations import split_s3
from prl.schema import TABLES
from prl.shards.layout import SetRef, find_sets, meta_root
from prl.shards.s3out import S3Out
from prl.shards.verify import VerifyResult, verify_set, verify_shards
from prl.shards.writer import read_ipc
from prl.store.tables import Store
from tests.crash_inputs import RewardInput, TraceInput
from tests.pipeline_helpers import assert_shards_sound, read_table


@dataclass
class Paths:
    """Where one harness run keeps its inputs (always local) and its store and OUT (local, or ``s3://``)."""

    root: Path
    store: str
    out: str

    @property
    def traces(self) -> str:
        return str(self.root / "in" / "traces")

    @property
    def rewards(self) -> str:
        return str(self.root / "in" / "rewards")

    @property
    def rows(self) -> Path:
        """Local copies of the rows of the table data files the accounting has read (:func:`snapshot_rows`)."""
        return self.root / "rows"

    @property
    def mirror(self) -> Path:
        """A local copy of an ``s3://`` OUT, object by object."""
        return self.root / "out-mirror"


def _twice(values: list[Any]) -> list[Any]:
    return sorted(v for v, n in Counter(values).items() if n > 1)[:5]


def assert_same(found: list[Any], expected: list[Any], what: str) -> None:
    """``found`` (any order) is ``expected`` (sorted), each exactly once; else name what is twice, missing, extra."""
    found = sorted(found)
    if found == expected:
        return
    twice, have, want = _twice(found), set(found), set(expected)
    raise AssertionError(
        f"{what}: {len(found)} rows, {len(expected)} expected; twice: {twice}; "
        f"missing: {sorted(want - have)[:5]}; unexpected: {sorted(have - want)[:5]}"
    )


def snapshot_rows(store: Store, name: str, columns: list[str], cache: Path | None) -> pl.DataFrame:
    """``columns`` of every row of table ``name`` at its latest version (empty when it does not exist), read
    data file by data file from the files its snapshot names. With ``cache`` (a local folder) the rows of a data
    file read before (the same path and size: a Delta data file is written once, never changed) come from the
    copy kept there, so an accounting reads only the files committed since the last one; without it the whole
    table is read through polars' own Delta reader."""
    table = store.open(name)
    schema = pa.schema([TABLES[name].field(c) for c in columns])
    if table is not None and cache is None:
        return read_table(store, name, columns)
    if table is None:
        empty = pl.from_arrow(schema.empty_table())
        assert isinstance(empty, pl.DataFrame)
        return empty
    adds = pa.table(table.get_add_actions()).select(["path", "size_bytes"]).to_pylist()
    parts = []
    for add in adds:
        path, size = unquote(add["path"]), add["size_bytes"]
        digest = hashlib.blake2b(json.dumps([name, path, size, columns]).encode(), digest_size=12).hexdigest()
        kept = cache / f"{digest}.parquet"
        if kept.exists():
            parts.append(pq.read_table(kept))
            continue
        file = f"{store.table_path(name)}/{path}"  # its size given: no HEAD for it
        fragment = ds.ParquetFileFormat().make_fragment(file, filesystem=store.fs, file_size=size)
        rows = fragment.to_table(columns=columns).cast(schema)
        kept.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, f"{kept}.part")
        os.replace(f"{kept}.part", kept)
        parts.append(rows)
    found = pl.from_arrow(pa.concat_tables(parts) if parts else schema.empty_table())
    assert isinstance(found, pl.DataFrame)
    return found


def _quarantined(store: Store, table: str, cache: Path | None) -> pl.DataFrame:
    """Quarantine's rows of ``table`` (:func:`snapshot_rows`)."""
    rows = snapshot_rows(store, "quarantine", ["quarantine_id", "table", "source_uri", "source_line"], cache)
    assert rows["quarantine_id"].n_unique() == rows.height, (
        f"quarantine ids twice: {_twice(rows['quarantine_id'].to_list())}"
    )
    return rows.filter(pl.col("table") == table)


def account_traces(store: Store, data: TraceInput, cache: Path | None) -> None:
    rows = snapshot_rows(store, "traces", ["sample_id", "source_uri", "source_line"], cache)
    assert_same(list(rows.iter_rows()), data.expected_rows(), "traces")
    bad = _quarantined(store, "traces", cache)
    assert_same(list(zip(bad["source_uri"], bad["source_line"])), sorted(data.expected_bad), "quarantined traces")


def account_rewards(store: Store, data: RewardInput, cache: Path | None) -> None:
    columns = ["source_uri", "source_line", "sample_id", "name", "value", "event_id"]
    rows = snapshot_rows(store, "rewards", columns, cache)
    assert rows["event_id"].null_count() == 0, "rows without an event id"
    assert rows["event_id"].n_unique() == rows.height, f"event ids twice: {_twice(rows['event_id'].to_list())}"
    found = list(rows.select("source_uri", "source_line", "sample_id", "name", "value").iter_rows())
    assert_same(found, data.expected_events(), "reward events")
    bad = _quarantined(store, "rewards", cache)
    assert_same(list(zip(bad["source_uri"], bad["source_line"])), data.expected_bad(), "quarantined reward lines")


def account_checks(store: Store, data: TraceInput, cache: Path | None) -> None:
    checked = snapshot_rows(store, "checks", ["sample_id"], cache)["sample_id"].to_list()
    assert_same(checked, sorted(data.expected_good), "checks")


def mirror_s3(uri: str, local: Path) -> None:
    """Make ``local`` an exact copy of the objects under ``uri``: changed ones (by ETag, noted in a folder beside
    it) fetched again, gone ones removed."""
    from prl.store.s3lock import shared_s3_client

    client = shared_s3_client()
    bucket, prefix = split_s3(uri)
    tags = local.with_name(local.name + "-etags")
    seen: set[Path] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) + 1 :]
            path, tag = local / rel, tags / rel
            seen.add(path)
            if path.exists() and tag.exists() and tag.read_text() == obj["ETag"]:
                continue
            for folder in (path.parent, tag.parent):
                folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
            tag.write_text(obj["ETag"])
    for root, dirs, names in os.walk(local, topdown=False):
        for name in names:
            path = Path(root) / name
            if path not in seen:
                path.unlink()
                (tags / path.relative_to(local)).unlink(missing_ok=True)
        for name in dirs:
            if not os.listdir(Path(root) / name):
                os.rmdir(Path(root) / name)


def _fingerprint(ref: SetRef) -> list[list[Any]]:
    """Name, size, mtime and inode of every file of a set (its rows' folder and its meta folder)."""
    files = []
    for folder in (ref.dir, os.path.dirname(ref.manifest_path)):
        for name in sorted(os.listdir(folder)):
            st = os.stat(os.path.join(folder, name))
            files.append([os.path.join(folder, name), st.st_size, st.st_mtime_ns, st.st_ino])
    return files


def _check_set(ref: SetRef, result: VerifyResult) -> list[str]:
    """Verify one set into ``result`` and check its folder holds exactly its manifest's parts, whose samples are
    its sample-id file's; its sample ids."""
    verify_set(ref, result)
    manifest = json.loads(Path(ref.manifest_path).read_text())
    names = {e["file"] for e in manifest["shards"]}
    assert set(os.listdir(ref.dir)) == names, f"{ref.set_id} holds files its manifest does not name"
    in_shards = []
    for name in sorted(names):
        in_shards += pq.read_table(os.path.join(ref.dir, name), columns=["sample_id"])["sample_id"].to_pylist()
    samples = read_ipc(ref.samples_path)["sample_id"].to_pylist()
    assert sorted(in_shards) == samples, f"{ref.set_id}: its parts do not hold its sample ids"
    return samples


def assert_sets_sound(out: Path, expected: set[str], known: Path) -> None:
    """After a finished build: every set of ``out`` complete and verifying, nothing visible without a manifest,
    no sample in two sets, the samples shipped exactly ``expected``. A set whose files (name, size, mtime, inode)
    are those it had when ``known`` last recorded it verified is not read again."""
    seen = json.loads(known.read_text()) if known.exists() else {}
    listed = {ref.set_id: ref for ref in find_sets(str(out))}
    hidden = [n for n in os.listdir(out) if not n.startswith(".") and (out / n).is_dir() and n not in listed]
    assert not hidden, f"visible without a manifest after a finished build: {hidden}"
    result, now, shipped = VerifyResult(path=str(out)), {}, []
    for set_id, ref in listed.items():
        fingerprint = _fingerprint(ref)
        entry = seen.get(set_id)
        if entry is None or entry["fingerprint"] != fingerprint:
            entry = {"fingerprint": fingerprint, "samples": _check_set(ref, result)}
        now[set_id] = entry
        shipped += entry["samples"]
    assert result.ok, result.problems[:5]
    assert_same(shipped, sorted(expected), "samples shipped")
    known.write_text(json.dumps(now))


def account_shards(p: Paths, data: TraceInput, final: bool) -> None:
    out = Path(p.out)
    if p.out.startswith("s3://"):
        remote = S3Out(p.out)
        local = os.path.dirname(remote.local_root)  # where builds stage on this host: a killed one's is gone too
        assert not os.path.exists(local), f"local staging left: {os.listdir(local)}"
        mirror_s3(p.out, p.mirror)
        mirror_s3(remote.url(remote.mkey()), Path(meta_root(p.mirror)))
        out = p.mirror
    if not out.exists():
        assert not data.expected_good, "nothing published"
        return
    staging = Path(meta_root(out)) / "staging"
    assert not staging.exists() or not os.listdir(staging), f"staging left: {os.listdir(staging)}"
    assert_sets_sound(out, data.expected_good, p.root / "verified.json")
    if final:  # every set read again, and verified where it lives
        assert_shards_sound(out, data.expected_good)
        result = verify_shards(p.out)
        assert result.ok and len(result.sets) == len(find_sets(str(out))), result.problems[:5]


def held_locks(p: Paths) -> list[str]:
    """The lock files (or objects) of the store."""
    if not p.store.startswith("s3://"):
        locks = Path(p.store) / "_locks"
        return sorted(n for n in os.listdir(locks) if n.endswith(".lock")) if locks.exists() else []
    from prl.store.s3lock import shared_s3_client

    bucket, prefix = split_s3(p.store)
    listed = shared_s3_client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_locks/")
    return sorted(obj["Key"] for obj in listed.get("Contents", []))


def account(command: str, p: Paths, traces: TraceInput, rewards: RewardInput, final: bool = False) -> None:
    """The accounting of ``command``'s own output (of every table its set-up wrote too when ``final``). The
    table rows of data files read by an earlier accounting come from its copies (:func:`snapshot_rows`), except
    in the final one, which reads every file."""
    store = Store(p.store)
    cache = None if final else p.rows
    if command == "ingest" or (final and command != "rewards"):
        account_traces(store, traces, cache)
    if command == "rewards":
        account_rewards(store, rewards, cache)
    if command == "check":
        account_checks(store, traces, cache)
    if command == "shards":
        account_shards(p, traces, final)
    assert not held_locks(p), f"locks left: {held_locks(p)}"
