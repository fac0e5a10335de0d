"""Where a shard set's files live (docs/out-layout.md), and which sets are current and complete.

``OUT`` holds rows and nothing else, so that every Parquet reader, pointed at ``OUT``, at ``OUT/**/*.parquet`` or at
a set folder, reads exactly the rows of the current sets. prl's own bookkeeping lives beside it, in ``.<name>.prl``
(the *meta folder*, :func:`meta_root`), where no reader of ``OUT`` looks::

    OUT/<set-id>/part-00000.parquet …          the rows: Parquet parts of one schema, nothing else
    .OUT.prl/out.json                          the OUT's marker: its layout format and its id (what locks name)
    .OUT.prl/sets/<set-id>/manifest.json       the set's manifest
    .OUT.prl/sets/<set-id>/sample_ids.arrow    the set's sample ids (Arrow IPC: what later builds skip)
    .OUT.prl/index.json                        one line per current set
    .OUT.prl/frontier.json, frontier/*.arrow   where the next build goes on (:mod:`prl.shards.frontier`)
    .OUT.prl/staging/…, retired/…              builds in progress, and sets on their way out

(``.OUT.prl`` stands for ``<parent of OUT>/.<name of OUT>.prl``, found from OUT's real path.) No file in the meta
folder is Parquet but staged and retired parts. A set is published by writing its meta folder, then renaming its
staged parts folder to ``OUT/<set-id>``: the rows appear all at once, on the same filesystem, and a set is
complete (:func:`set_ref`) exactly when its rows are there. Polars reads every file of a folder it is given and
fails on any that is not Parquet, and DuckDB's and polars' recursive globs enter hidden folders: that is why
nothing of prl's lives inside ``OUT``.

An ``s3://bucket/prefix/OUT`` keeps its meta folder at ``s3://bucket/prefix/.OUT.prl/`` (:mod:`prl.shards.s3out`),
staged locally and committed by its manifest, uploaded last.

An ``OUT`` is empty, missing, or a prl OUT of this format (:func:`out_state`); anything else is refused.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from prl.errors import UsageError

META = ".prl"
"""The name of an earlier layout's meta folder inside OUT (its presence marks an OUT of that layout)."""
META_SUFFIX = ".prl"
MANIFEST = "manifest.json"
SAMPLES_FILE = "sample_ids.arrow"
MARKER = "out.json"
OUT_FORMAT = 2
"""The layout format ``.OUT.prl/out.json`` names (2: meta without Parquet, staging beside ``OUT``)."""
INDEX = "index.json"
PART_PREFIX = "part-"


SET_ID_RE = re.compile(r"v\d+-[0-9a-f]{12}")
"""What a set id looks like (:func:`prl.shards.build.build_shards`): only such folders are ever removed from OUT."""


def meta_name(name: str) -> str:
    """The meta folder's name for an OUT named ``name``: ``.<name>.prl``."""
    return f".{name}{META_SUFFIX}"


def meta_root(out: str) -> str:
    """``<parent>/.<name>.prl``: prl's bookkeeping of the OUT ``out``, beside it (from its real path, so every
    spelling of ``out`` that is not a mount point of its own finds the same folder)."""
    parent, name = os.path.split(os.path.realpath(out))
    return os.path.join(parent, meta_name(name))


def marker_path(out: str) -> str:
    return os.path.join(meta_root(out), MARKER)


def meta_dir(out: str, set_id: str) -> str:
    """``.OUT.prl/sets/<set-id>``: the set's manifest and sample-id file."""
    return os.path.join(meta_root(out), "sets", set_id)


def manifest_path(out: str, set_id: str) -> str:
    return os.path.join(meta_dir(out, set_id), MANIFEST)


def samples_path(out: str, set_id: str) -> str:
    return os.path.join(meta_dir(out, set_id), SAMPLES_FILE)


def index_path(out: str) -> str:
    return os.path.join(meta_root(out), INDEX)


def staging_root(out: str) -> str:
    """``.OUT.prl/staging``: a build writes its set here (on OUT's filesystem, outside it), then renames the parts
    folder to ``OUT/<set-id>``."""
    return os.path.join(meta_root(out), "staging")


def retired_root(out: str) -> str:
    """``.OUT.prl/retired``: where replaced sets are moved (out of ``OUT`` at once) before they are removed."""
    return os.path.join(meta_root(out), "retired")


@dataclass(frozen=True)
class SetRef:
    """One complete shard set: its id, the folder of its rows and where its manifest is."""

    out: str
    set_id: str
    dir: str
    manifest_path: str
    samples_path: str


def set_ref(out: str, set_id: str) -> SetRef | None:
    """The set ``set_id`` of ``out`` when it is complete (its folder and its manifest exist), else None."""
    folder = os.path.join(out, set_id)
    path = manifest_path(out, set_id)
    if os.path.isdir(folder) and os.path.isfile(path):
        return SetRef(out, set_id, folder, path, samples_path(out, set_id))
    return None


def find_sets(out: str) -> list[SetRef]:
    """The complete shard sets of ``out``, by set id (an ``OUT`` that does not exist holds none)."""
    if not os.path.isdir(out):
        return []
    refs = [set_ref(out, name) for name in sorted(os.listdir(out)) if not name.startswith((".", "_"))]
    return [r for r in refs if r is not None]


def read_marker(out: str) -> dict[str, Any] | None:
    """``.OUT.prl/out.json`` as written (``{"format", "out_id"}``), None when missing or not such an object."""
    try:
        with open(marker_path(out), encoding="utf-8") as fh:
            obj = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("out_id"), str) or not isinstance(obj.get("format"), int):
        return None
    return obj


OLD_LAYOUT = (
    "{out} was written by an earlier prl (its meta folder is inside it, not {META}/{MARKER} of format {FORMAT} "
    "beside it): build into a new folder (its sets stay readable as Parquet, but this prl neither continues nor "
    "reads them)"
)


def out_state(out: str) -> str:
    """What the local folder ``out`` is: ``missing``, ``empty``, ``prl`` (a prl OUT of this layout: its meta
    folder's marker), ``old`` (a prl OUT of an earlier layout: ``.OUT.prl/``, a legacy ``_index.json``, or a
    marker of another format) or ``foreign`` (a file, or a folder holding anything without a marker). Only the
    first three may be built into."""
    if os.path.lexists(out) and not os.path.isdir(out):
        return "foreign"
    names = os.listdir(out) if os.path.isdir(out) else []
    if META in names or "_index.json" in names:
        return "old"
    marker = read_marker(out)
    if marker is not None:
        return "prl" if marker["format"] == OUT_FORMAT else "old"
    if not os.path.lexists(out):
        return "missing"
    return "foreign" if names else "empty"


def check_readable(out: str) -> None:
    """Refuse (:class:`~prl.errors.UsageError`) an ``OUT`` of an earlier layout: nothing of it is read."""
    if out_state(out) == "old":
        raise UsageError(OLD_LAYOUT.format(out=out, META=META, MARKER=MARKER, FORMAT=OUT_FORMAT))


def is_out(path: str) -> bool:
    """Whether ``path`` is an ``OUT`` folder of this layout (its meta folder's ``out.json`` marker)."""
    return out_state(path) == "prl"


def resolve(path: str) -> list[SetRef]:
    """The sets ``path`` names: the one set when ``path`` is a set folder, else every complete set of an
    ``OUT`` folder. Raises :class:`~prl.errors.UsageError` when it is neither, or an ``OUT`` of an earlier
    layout."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path.rstrip(os.sep))
    own = set_ref(parent, name) if name and not name.startswith(".") else None
    if own is not None:
        return [own]
    if os.path.isdir(path):
        check_readable(path)
        sets = find_sets(path)
        if sets or is_out(path):
            return sets
        if SET_ID_RE.fullmatch(name):
            check_readable(parent)  # a set folder of an OUT of an earlier layout
        raise UsageError(f"{path} holds no shard set (no set folder with a manifest)")
    raise UsageError(f"{path} is not a shard set or a folder of shard sets")


__all__ = [
    "INDEX",
    "MANIFEST",
    "MARKER",
    "META",
    "META_SUFFIX",
    "OUT_FORMAT",
    "SAMPLES_FILE",
    "SET_ID_RE",
    "SetRef",
    "check_readable",
    "find_sets",
    "index_path",
    "manifest_path",
    "marker_path",
    "meta_dir",
    "meta_name",
    "meta_root",
    "out_state",
    "read_marker",
    "resolve",
    "retired_root",
    "samples_path",
    "set_ref",
    "staging_root",
]
