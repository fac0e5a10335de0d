"""Atomic publication of a shard set: staging folder, fsync + rename of each file, the set folder's rename, the
``OUT/_index.json`` listing (design.md §6).

A build writes everything into ``OUT/.staging-<set-id>-<pid>-<nonce>/``: each part as ``*.tmp``, fsynced and
renamed (:func:`publish_file`), then ``manifest.json`` the same way (:func:`write_json`), then the staging folder
is fsynced and renamed to ``OUT/<set-id>/`` (:func:`publish_set`; an existing set of that id is moved aside to
``.trash-…`` first and removed after) and ``OUT`` is fsynced. A reader that sees a set folder therefore sees its
manifest and every file it names. Staging and trash folders of killed builds are removed by the next build
(:func:`clean_stale_staging`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from typing import Any

from prl.schema import SCHEMA_VERSION
from prl.shards.manifest import INDEX, existing_sets
from prl.store.locks import pid_alive


def sha256_file(path: str) -> str:
    """Hex sha256 of a file's bytes (:func:`hashlib.file_digest`)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def fsync_dir(path: str) -> None:
    """fsync a folder, so the renames inside it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_file(tmp: str, final: str) -> None:
    """fsync ``tmp`` and rename it to ``final``."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def write_json(path: str, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` (temp file, fsync, rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, allow_nan=False)
        fh.write("\n")
    publish_file(tmp, path)


def _nonce() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def make_staging(out: str, set_id: str) -> str:
    """Create and return a fresh staging folder for ``set_id`` inside ``out``."""
    staging = os.path.join(out, f".staging-{set_id}-{_nonce()}")
    os.makedirs(staging)
    return staging


def clean_stale_staging(out: str) -> None:
    """Remove staging and trash folders left by killed builds (their pid is gone)."""
    for name in os.listdir(out):
        if not name.startswith((".staging-", ".trash-")):
            continue
        parts = name.split("-")
        pid = int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None
        if pid is None or not pid_alive(pid):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)


def publish_set(staging: str, out: str, set_id: str) -> str:
    """Make the complete ``staging`` folder the set ``OUT/<set_id>/`` (replacing one of that id) and rewrite the
    index; returns the set folder."""
    fsync_dir(staging)
    final = os.path.join(out, set_id)
    if os.path.exists(final):
        trash = os.path.join(out, f".trash-{set_id}-{_nonce()}")
        os.replace(final, trash)
        os.replace(staging, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staging, final)
    fsync_dir(out)
    write_index(out)
    return final


def write_index(out: str) -> None:
    """Rewrite ``OUT/_index.json`` from the manifests present: one line per set, first sets first."""
    sets = sorted(existing_sets(out), key=lambda m: (len(m.excluded_sets), m.set_id))
    index = {
        "schema_version": SCHEMA_VERSION,
        "sets": [
            {
                "set_id": m.set_id,
                "rows": m.totals.rows,
                "tokens": m.totals.tokens,
                "source_versions": m.source_versions,
                "options_sha256": m.options_sha256,
                "samples_file": f"{m.set_id}/{m.samples.file}",
            }
            for m in sets
        ],
    }
    write_json(os.path.join(out, INDEX), index)


__all__ = [
    "clean_stale_staging",
    "fsync_dir",
    "make_staging",
    "publish_file",
    "publish_set",
    "sha256_file",
    "write_index",
    "write_json",
]
