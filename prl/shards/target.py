"""Where a build publishes: a local OUT folder (:class:`LocalOut`, renames in :mod:`prl.shards.publish`) or an
``s3://`` prefix (:class:`prl.shards.s3out.S3Out`, uploads ending with a conditional put). Both offer what
:func:`prl.shards.build.build_shards` needs, so the build itself does not know which one it writes to:
the ids of the complete sets (never their manifests: a build's reads of OUT do not grow with its sets) and the
sample ids some of them shipped, a staging folder, publication, retirement, the index (made before publishing,
written after), and the removal of what killed builds left.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from prl.errors import UsageError
from prl.io.locations import S3_SCHEME, is_remote
from prl.shards.layout import find_sets, manifest_path
from prl.shards.manifest import Manifest
from prl.shards.plan import shipped_ids
from prl.shards.publish import (
    Staging,
    clean_stale_staging,
    discard_staging,
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

    def check(self) -> None: ...
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


class LocalOut:
    """A local OUT folder (made by the first build that ships; removed again when that build ships nothing)."""

    def __init__(self, path: str) -> None:
        self.uri = os.path.abspath(path.removeprefix("file://"))
        self._made = False

    def check(self) -> None:
        """Nothing to check up front: folder problems surface as the build writes (exit 5)."""

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
        self._made = not os.path.isdir(self.uri)
        os.makedirs(self.uri, exist_ok=True)
        return make_staging(self.uri, set_id)

    def discard(self, staging: Staging, nothing_shipped: bool = False) -> None:
        """Remove ``staging``; after a build that shipped nothing, the OUT folder too when that build made it."""
        discard_staging(staging, self.uri)
        if self._made and nothing_shipped:
            self._made = False
            try:
                os.rmdir(self.uri)
            except OSError:
                pass  # something else was put there meanwhile: not ours to remove

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


__all__ = ["LocalOut", "OutTarget", "out_target"]
