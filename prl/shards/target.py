"""Where a build publishes: a local OUT folder (:class:`LocalOut`, renames in :mod:`prl.shards.publish`) or an
``s3://`` prefix (:class:`prl.shards.s3out.S3Out`, uploads ending with a conditional put). Both offer what
:func:`prl.shards.build.build_shards` needs, so the build itself does not know which one it writes to:
the ids of the complete sets (never their manifests: a build's reads of OUT do not grow with its sets) and the
sample ids some of them shipped, a staging folder, publication, retirement, the index (made before publishing,
written after), and the removal of what killed builds left.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from prl.errors import UsageError
from prl.io.locations import S3_SCHEME, is_remote
from prl.shards.layout import MARKER, check_readable, find_sets, manifest_path, marker_path, meta_root, out_state
from prl.shards.manifest import Manifest
from prl.shards.plan import shipped_ids
from prl.shards.publish import (
    Staging,
    clean_stale_staging,
    discard_staging,
    ensure_marker,
    make_staging,
    next_index,
    publish_set,
    refresh_index,
    retire_sets,
    write_index,
)

if TYPE_CHECKING:
    from prl.shards.s3out import S3Out  # loaded where an s3:// OUT is used: boto3 only then


class OutTarget(Protocol):
    """What a build needs of its OUT (see the module docstring); ``uri`` is the OUT as results report it."""

    uri: str

    def check(self, store_uri: str) -> None: ...
    def lock_step(self) -> str: ...
    def clean(self, keep: str | None) -> None: ...
    def set_ids(self) -> list[str]: ...
    def shipped_ids(self, prior: list[str]) -> pa.Array | None: ...
    def stage(self, set_id: str) -> Staging: ...
    def discard(self, staging: Staging, nothing_shipped: bool = False) -> None: ...
    def publish(self, staging: Staging, set_id: str, check_lock: Callable[[], None]) -> str: ...
    def retire(self, set_ids: list[str]) -> None: ...
    def next_index(self, manifest: Manifest, replaced: Collection[str] = ()) -> dict[str, Any]: ...
    def write_index(self, index: dict[str, Any]) -> None: ...
    def refresh_index(self) -> bool: ...
    def manifest_uri(self, set_id: str) -> str: ...


def _ancestors(path: str) -> list[str]:
    """``path`` and every folder above it that exists, as spelled and as resolved (symlinks followed)."""
    found: list[str] = []
    for start in (os.path.abspath(path), os.path.realpath(path)):
        here = start
        while True:
            if os.path.exists(here):
                found.append(here)
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
    return found


def _within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it, by what the folders are (device and inode: a symlink, a bind
    mount or another spelling of ``folder`` counts), not by how they are spelled."""
    try:
        target = os.stat(folder)
    except OSError:
        return False
    return any(os.path.samestat(os.stat(a), target) for a in _ancestors(path))


def refuse_store_overlap(out: str, store_uri: str) -> None:
    """Refuse (:class:`~prl.errors.UsageError`) a local ``out`` inside the store (a table, ``_index``, any path
    under it) or holding it: the store's maintenance would delete published parts, and readers of ``OUT`` would
    read the store's tables."""
    if is_remote(store_uri):
        return
    store = store_uri.removeprefix("file://")
    if _within(out, store):
        raise UsageError(f"shard output {out} is inside the store {store}: choose a folder outside the store")
    if _within(store, out) or _within(store, meta_root(out)):
        raise UsageError(f"shard output {out} holds the store {store}: choose a folder outside the store")


class LocalOut:
    """A local OUT folder: missing, empty, or a prl OUT of this layout (anything else is refused)."""

    def __init__(self, path: str) -> None:
        self.uri = os.path.abspath(path.removeprefix("file://"))
        self._made = False

    def check(self, store_uri: str) -> None:
        """Refuse, before anything is built or written: an OUT inside the store (or holding it), an OUT of an
        earlier prl layout, and a folder that is neither empty nor a prl OUT (exit 2)."""
        refuse_store_overlap(self.uri, store_uri)
        state = out_state(self.uri)
        if state == "old":
            check_readable(self.uri)
        if state == "foreign":
            what = "is not a folder" if not os.path.isdir(self.uri) else "holds files and is no prl shard output"
            raise UsageError(
                f"shard output {self.uri} {what} (no {marker_path(self.uri)}): build into an empty or new folder"
            )

    def lock_step(self) -> str:
        """The build lock's step: ``build-shards-<digest of the OUT's id>`` (:func:`ensure_marker`, which makes
        the folder and its marker when missing), the same for every spelling of the OUT."""
        self._made = out_state(self.uri) in ("missing", "empty")
        out_id = ensure_marker(self.uri)
        return f"build-shards-{hashlib.sha256(f'out:{out_id}'.encode()).hexdigest()[:12]}"

    def clean(self, keep: str | None) -> None:
        """Remove what killed builds left (:func:`clean_stale_staging`; ``keep`` is not needed: a local set
        appears by rename, never half)."""
        if os.path.isdir(self.uri):
            clean_stale_staging(self.uri)  # leftovers of killed builds go first, even when nothing is new

    def set_ids(self) -> list[str]:
        """Ids of the complete sets, sorted (no manifest is read)."""
        return [ref.set_id for ref in find_sets(self.uri)]

    def shipped_ids(self, prior: list[str]) -> pa.Array | None:
        return shipped_ids(self.uri, prior)

    def stage(self, set_id: str) -> Staging:
        ensure_marker(self.uri)
        return make_staging(self.uri, set_id)

    def discard(self, staging: Staging, nothing_shipped: bool = False) -> None:
        """Remove ``staging``; after a build that shipped nothing, the OUT folder and its meta folder too when
        that build made them and they hold nothing else (a first build that ships nothing leaves nothing)."""
        discard_staging(staging, self.uri)
        if self._made and nothing_shipped:
            self._made = False
            meta = meta_root(self.uri)
            with contextlib.suppress(OSError):
                if os.listdir(meta) == [MARKER] and not os.listdir(self.uri):
                    os.remove(os.path.join(meta, MARKER))
                    os.rmdir(meta)
                    os.rmdir(self.uri)

    def publish(self, staging: Staging, set_id: str, check_lock: Callable[[], None]) -> str:
        check_lock()
        return publish_set(staging, self.uri, set_id)

    def retire(self, set_ids: list[str]) -> None:
        retire_sets(self.uri, set_ids)

    def next_index(self, manifest: Manifest, replaced: Collection[str] = ()) -> dict[str, Any]:
        return next_index(self.uri, manifest, replaced)

    def write_index(self, index: dict[str, Any]) -> None:
        write_index(self.uri, index)

    def refresh_index(self) -> bool:
        return refresh_index(self.uri)

    def manifest_uri(self, set_id: str) -> str:
        return manifest_path(self.uri, set_id)


def out_target(out: str) -> LocalOut | S3Out:
    """The target for ``out``: a local folder (or ``file://``) or an ``s3://bucket/prefix``; any other scheme
    is a usage error."""
    if out.startswith(S3_SCHEME):
        from prl.shards.s3out import S3Out

        return S3Out(out)
    if is_remote(out):
        raise UsageError(f"shard output must be a local folder or an s3:// prefix, not {out!r}")
    return LocalOut(out)


__all__ = ["LocalOut", "OutTarget", "out_target", "refuse_store_overlap"]
