"""Atomic publication of a shard set in the layout of :mod:`prl.shards.layout` (docs/out-layout.md).

A build writes into a staging folder beside ``OUT`` (``<parent>/.<name>.prl-staging/<set-id>-<pid>-<nonce>/``,
:class:`Staging`, on ``OUT``'s filesystem and outside it): the parts into ``parts/`` and the sample ids and
``manifest.json`` into ``meta/``, each file as ``*.tmp``, fsynced and renamed (:func:`publish_file`,
:func:`write_json`); spills go to ``spill/``. :func:`publish_set` then renames ``meta/`` to
``.OUT.prl/sets/<set-id>/`` and after it ``parts/`` to ``OUT/<set-id>/``: the rows appear all at once, and at that
instant the set is complete (its manifest is there already), so a reader of ``OUT`` sees exactly the rows of the
complete sets, whenever it looks. A set of the same id is moved aside first (its rows, then its meta) and removed
after; :func:`retire_sets` does the same for the sets a rebuild replaces, after the new set is published. The
build makes the new ``.OUT.prl/index.json`` (:func:`next_index`) before it publishes and writes it
(:func:`write_index`) after. What killed builds left (staging and retired folders whose process is gone, meta
folders without rows) is removed by the next build (:func:`clean_stale_staging`).

``.OUT.prl/out.json`` (:func:`ensure_marker`) names the OUT: made once, atomically (a hard link that fails when
another process made it first), it is what the build lock is keyed by, so that any spelling of the OUT (a
symlink, a bind mount, another path) takes the same lock.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from prl.errors import UsageError
from prl.shards.index import index_after_publish, mended_index
from prl.shards.layout import (
    OUT_FORMAT,
    SET_ID_RE,
    SetRef,
    find_sets,
    index_path,
    marker_path,
    meta_dir,
    meta_root,
    read_marker,
    retired_root,
    set_ref,
    staging_root,
)
from prl.shards.manifest import Manifest
from prl.store.liveness import pid_alive


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
    """Write ``obj`` as indented, key-sorted JSON to ``path`` (temp file, fsync, rename). A float that is not
    finite, which JSON cannot spell, is written as the string ``"inf"``, ``"-inf"`` or ``"nan"``
    (:func:`json_safe`): a value read from a store never stops a build from publishing."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(json_safe(obj), fh, indent=2, sort_keys=True, allow_nan=False)
        fh.write("\n")
    publish_file(tmp, path)


def json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite, at any depth, replaced by its name: ``"inf"``, ``"-inf"``
    or ``"nan"`` (the manifest's spelling, as its ``pad_logprob``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else nonfinite_name(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def nonfinite_name(value: float) -> str:
    """``"nan"``, ``"inf"`` or ``"-inf"``."""
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def _nonce() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Staging:
    """A build's staging folder: ``parts`` (becomes ``OUT/<set-id>``), ``meta`` (becomes the set's meta folder)
    and ``spill`` (removed once the shards are written)."""

    root: str

    @property
    def parts(self) -> str:
        return os.path.join(self.root, "parts")

    @property
    def meta(self) -> str:
        return os.path.join(self.root, "meta")

    @property
    def spill(self) -> str:
        return os.path.join(self.root, "spill")


def make_staging(out: str, set_id: str) -> Staging:
    """Create a fresh staging folder for ``set_id`` beside ``out`` (with its three subfolders). A staging
    folder from which ``out`` cannot be reached by a rename (``out`` is a mount point: its parent is another
    mount) is a :class:`~prl.errors.UsageError` naming a folder inside the mount to use instead."""
    staging = Staging(os.path.join(staging_root(out), f"{set_id}-{_nonce()}"))
    for folder in (staging.parts, staging.meta, staging.spill):
        os.makedirs(folder)
    probe = os.path.join(out, f"{PROBE}{_nonce()}")  # an empty folder, for a moment: no reader reads a row of it
    os.makedirs(out, exist_ok=True)
    try:
        os.rename(staging.spill, probe)
    except OSError as exc:
        shutil.rmtree(staging.root, ignore_errors=True)
        if exc.errno != errno.EXDEV:
            raise
        raise UsageError(
            f"shard output {out} is a mount point: a set is staged beside OUT and renamed into it, which needs "
            f"one filesystem mount; build into a folder inside it (such as {os.path.join(out, 'shards')})"
        ) from None
    os.rename(probe, staging.spill)
    return staging


def discard_staging(staging: Staging, out: str) -> None:
    """Remove a staging folder that will not be published (a failed build, or nothing to ship), and the staging
    root beside ``OUT`` too when nothing else is left in it."""
    shutil.rmtree(staging.root, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(staging_root(out))  # not empty: other builds or retired sets live there


def _pid_of(name: str) -> int | None:
    parts = name.split("-")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


PROBE = ".prl-probe-"
"""The name of the empty folder :func:`make_staging` renames into OUT and back (a kill can leave it)."""


def clean_stale_staging(out: str) -> None:
    """Remove what killed builds left (call it holding the build lock): staging and retired folders whose pid is
    gone, set folders without a manifest and meta folders without rows (a build or a retirement killed between
    its two renames)."""
    for parent in (staging_root(out), retired_root(out)):
        if not os.path.isdir(parent):
            continue
        for name in os.listdir(parent):
            pid = _pid_of(name)
            if name != "retired" and (pid is None or not pid_alive(pid)):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    if os.path.isdir(out):
        for name in os.listdir(out):
            if name.startswith(PROBE):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
            if SET_ID_RE.fullmatch(name) and set_ref(out, name) is None and os.path.isdir(os.path.join(out, name)):
                _retire(out, name)
    sets = os.path.dirname(meta_dir(out, "x"))
    if os.path.isdir(sets):
        for name in os.listdir(sets):
            if not os.path.isdir(os.path.join(out, name)):
                shutil.rmtree(os.path.join(sets, name), ignore_errors=True)


def _retire(out: str, set_id: str) -> None:
    """Move set ``set_id`` out of ``OUT`` (its rows first: from then on no reader sees them, and then its meta
    folder) into the retired folder beside ``OUT``, and remove it there."""
    trash = os.path.join(retired_root(out), f"{set_id}-{_nonce()}")
    os.makedirs(trash)
    for source, name in ((os.path.join(out, set_id), "parts"), (meta_dir(out, set_id), "meta")):
        if os.path.exists(source):
            os.replace(source, os.path.join(trash, name))
    shutil.rmtree(trash, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(retired_root(out))
        os.rmdir(staging_root(out))


def publish_set(staging: Staging, out: str, set_id: str) -> str:
    """Make the complete ``staging`` the set ``OUT/<set_id>/`` with its meta folder (replacing a set of that id):
    the meta folder first, then the rows, which appear all at once; returns the set folder. The index is the
    caller's to write (:func:`next_index`, :func:`write_index`)."""
    fsync_dir(staging.parts)
    fsync_dir(staging.meta)
    final = os.path.join(out, set_id)
    if os.path.exists(final) or os.path.exists(meta_dir(out, set_id)):
        _retire(out, set_id)
    os.makedirs(os.path.dirname(meta_dir(out, set_id)), exist_ok=True)
    os.replace(staging.meta, meta_dir(out, set_id))
    fsync_dir(os.path.dirname(meta_dir(out, set_id)))
    os.replace(staging.parts, final)  # the commit: the rows appear, and the set is complete
    fsync_dir(out)
    shutil.rmtree(staging.root, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(staging_root(out))  # not empty: other builds live there
    return final


def retire_sets(out: str, set_ids: list[str]) -> None:
    """Remove the sets ``set_ids`` of ``out`` (those a rebuild replaced), each rows first, then meta."""
    for set_id in set_ids:
        _retire(out, set_id)
    if set_ids:
        fsync_dir(out)


def ensure_marker(out: str) -> str:
    """The id of the local OUT ``out`` (``.OUT.prl/out.json``), making the folder and its marker when missing:
    the marker is written to a temporary file and hard-linked into place, which fails when another process made
    it first (then its id is the one)."""
    os.makedirs(out, exist_ok=True)
    marker = read_marker(out)
    if marker is not None:
        return str(marker["out_id"])
    os.makedirs(meta_root(out), exist_ok=True)
    tmp = f"{marker_path(out)}.tmp-{_nonce()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"format": OUT_FORMAT, "out_id": uuid.uuid4().hex}, fh)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, marker_path(out))
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    fsync_dir(meta_root(out))
    made = read_marker(out)
    if made is None:
        raise UsageError(f"{marker_path(out)} is not a marker prl wrote: this is no shard output to build into")
    return str(made["out_id"])


def _sets_and_index(out: str) -> tuple[dict[str, SetRef], bytes | None]:
    """The sets of ``out`` by id and the bytes of its ``index.json`` (None when it cannot be read)."""
    refs = {ref.set_id: ref for ref in find_sets(out)}
    try:
        with open(index_path(out), "rb") as fh:
            return refs, fh.read()
    except OSError:
        return refs, None


def next_index(out: str, manifest: Manifest, replaced: Collection[str] = ()) -> dict[str, Any]:
    """The ``.OUT.prl/index.json`` object once ``manifest``'s set is published and the sets ``replaced`` are
    retired (:func:`prl.shards.index.index_after_publish`), made before the set is published."""
    refs, raw = _sets_and_index(out)
    return index_after_publish(raw, refs, manifest, lambda set_id: Manifest.of(refs[set_id]), replaced)


def refresh_index(out: str) -> bool:
    """Rewrite ``.OUT.prl/index.json`` when it is not the index of the sets listed now (a build killed between
    publishing its set and writing the index leaves it one set behind): :func:`prl.shards.index.updated_index`,
    which reads only the manifests of listed sets missing from it. Returns whether it was written (never when
    ``out`` holds no set and no index)."""
    refs, raw = _sets_and_index(out)
    index = mended_index(raw, refs, lambda set_id: Manifest.of(refs[set_id]))
    if index is None:
        return False
    write_index(out, index)
    return True


def write_index(out: str, index: dict[str, Any]) -> None:
    """Write ``index`` (:func:`next_index`) as ``.OUT.prl/index.json`` (derived data: the last writer wins)."""
    os.makedirs(meta_root(out), exist_ok=True)
    write_json(index_path(out), index)


__all__ = [
    "Staging",
    "clean_stale_staging",
    "discard_staging",
    "ensure_marker",
    "fsync_dir",
    "json_safe",
    "make_staging",
    "next_index",
    "nonfinite_name",
    "publish_file",
    "publish_set",
    "refresh_index",
    "retire_sets",
    "sha256_file",
    "write_index",
    "write_json",
]
