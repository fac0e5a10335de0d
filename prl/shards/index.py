"""``.OUT.prl/index.json``: one line per current set (docs/out-layout.md), kept up to date without reading every manifest.

:func:`index_json` is the index of some manifests: ``{"schema_version", "sets": [line, …]}``, one line per set
(:func:`index_line`) in :func:`index_order`. A build rewrites the index after it publishes or retires sets;
:func:`updated_index` makes the new index from the one there and the ids of the sets listed now. A set's line
is a function of its manifest, and a published manifest is never rewritten (a set id is a digest of what made the
set; a set only goes away, when a rebuild retires it), so the lines of sets already in the index are kept as they
are and only the manifests of listed sets missing from it are read (normally the one just published), plus the
few that place them in order. Lines of sets no longer listed are dropped. An index that is missing, not JSON,
of another schema version or not of this shape is no help: then every listed manifest is read, as
:func:`index_json` needs. Either way the result is the index of every listed set's manifest, line for line.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from prl.schema import SCHEMA_VERSION
from prl.shards.manifest import Manifest

LINE_KEYS = frozenset({"set_id", "rows", "tokens", "source_versions", "options_sha256", "files"})
"""The keys of one set's line, every one always present."""


def index_order(manifest: Manifest) -> tuple[int, str]:
    """Where a set's line goes: first sets first (fewer sets excluded), then by set id."""
    return len(manifest.excluded_sets), manifest.set_id


def index_line(manifest: Manifest) -> dict[str, Any]:
    """One set's line: its id, rows, tokens, source versions, options digest and part files (``<set-id>/<file>``)."""
    return {
        "set_id": manifest.set_id,
        "rows": manifest.totals.rows,
        "tokens": manifest.totals.tokens,
        "source_versions": manifest.source_versions,
        "options_sha256": manifest.options_sha256,
        "files": [f"{manifest.set_id}/{e.file}" for e in manifest.shards],
    }


def index_json(manifests: list[Manifest]) -> dict[str, Any]:
    """The ``.OUT.prl/index.json`` object of the sets ``manifests``: one line per set, in :func:`index_order`."""
    return {"schema_version": SCHEMA_VERSION, "sets": [index_line(m) for m in sorted(manifests, key=index_order)]}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _line_ok(line: Any) -> bool:
    if not isinstance(line, Mapping) or set(line) != LINE_KEYS or not isinstance(line["set_id"], str):
        return False
    versions, files = line["source_versions"], line["files"]
    return (
        _is_count(line["rows"])
        and _is_count(line["tokens"])
        and isinstance(line["options_sha256"], str)
        and isinstance(versions, Mapping)
        and all(v is None or _is_count(v) for v in versions.values())
        and isinstance(files, list)
        and all(isinstance(f, str) and f.startswith(f"{line['set_id']}/") for f in files)
    )


def index_lines(raw: bytes | None) -> list[dict[str, Any]] | None:
    """The set lines, in order, of the index ``raw`` (an ``index.json``'s bytes) when it is one this prl writes:
    JSON of this schema version with well-formed lines of distinct set ids; else None (also for None)."""
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, Mapping) or obj.get("schema_version") != SCHEMA_VERSION:
        return None
    lines = obj.get("sets")
    if not isinstance(lines, list) or not all(_line_ok(line) for line in lines):
        return None
    if len({line["set_id"] for line in lines}) != len(lines):
        return None
    return [dict(line) for line in lines]


def updated_index(raw: bytes | None, listed: Collection[str], manifest: Callable[[str], Manifest]) -> dict[str, Any]:
    """``index_json`` of the manifests of the sets ``listed`` (ids), given the index there now (``raw``, its bytes,
    or None) and ``manifest`` (set id → its manifest, read on demand; each is asked for at most once).

    The lines of listed sets already in ``raw`` are kept and only the other listed sets' manifests are read; each
    of those is placed after comparing with the last kept line (one manifest read: the new set normally goes last)
    or, when it does not go last, by bisection (a few reads). Falls back to reading every listed manifest when
    ``raw`` is no index this prl wrote (:func:`index_lines`)."""
    previous = index_lines(raw)
    if previous is None:
        return index_json([manifest(set_id) for set_id in sorted(listed)])
    wanted = set(listed)
    lines = {line["set_id"]: line for line in previous if line["set_id"] in wanted}
    order = list(lines)  # already in index order
    keys: dict[str, tuple[int, str]] = {}

    def key(set_id: str) -> tuple[int, str]:
        if set_id not in keys:
            keys[set_id] = index_order(manifest(set_id))
        return keys[set_id]

    for added in sorted((manifest(set_id) for set_id in sorted(wanted - set(lines))), key=index_order):
        keys[added.set_id] = index_order(added)
        lines[added.set_id] = index_line(added)
        if not order or key(order[-1]) < keys[added.set_id]:
            order.append(added.set_id)
        else:
            order.insert(bisect.bisect_left(order, keys[added.set_id], 0, len(order) - 1, key=key), added.set_id)
    return {"schema_version": SCHEMA_VERSION, "sets": [lines[set_id] for set_id in order]}


def is_index(raw: bytes | None, index: Mapping[str, Any]) -> bool:
    """Whether ``raw`` (an ``index.json``'s bytes, or None) is the JSON of ``index``."""
    if raw is None:
        return False
    try:
        return bool(json.loads(raw) == index)
    except ValueError:
        return False


def mended_index(
    raw: bytes | None, listed: Collection[str], manifest: Callable[[str], Manifest]
) -> dict[str, Any] | None:
    """The index to write when ``raw`` (an ``index.json``'s bytes, None when missing) is not the index of the sets
    ``listed`` (:func:`updated_index`: only manifests of listed sets missing from it are read); None when there is
    nothing to write: ``raw`` is that index already, or there is no set and no index."""
    if not listed and raw is None:
        return None
    index = updated_index(raw, listed, manifest)
    return None if is_index(raw, index) else index


def index_after_publish(
    raw: bytes | None,
    listed: Collection[str],
    published: Manifest,
    manifest: Callable[[str], Manifest],
    replaced: Collection[str] = (),
) -> dict[str, Any]:
    """The index once ``published`` (its manifest in hand) is published and the sets ``replaced`` are retired:
    :func:`updated_index` of the sets ``listed`` now, less ``replaced``, plus the published one. Made before the
    set is published, so that a manifest ``manifest`` cannot read (:class:`prl.shards.manifest.ManifestError`)
    stops the build before it publishes anything."""
    new = published.set_id
    ids = [*(s for s in listed if s != new and s not in replaced), new]
    return updated_index(raw, ids, lambda set_id: published if set_id == new else manifest(set_id))


__all__ = [
    "LINE_KEYS",
    "index_after_publish",
    "index_json",
    "index_line",
    "index_lines",
    "index_order",
    "is_index",
    "mended_index",
    "updated_index",
]
