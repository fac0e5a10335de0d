"""Where a shard set's files live in ``OUT`` (docs/design.md), and which sets are current and complete.

A set folder holds exactly its rows, so any Parquet reader pointed at it reads the set and nothing else::

    OUT/<set-id>/part-00000.parquet …            the rows: Parquet parts of one schema, nothing else
    OUT/.prl/sets/<set-id>/manifest.json        written last: the set is complete once it exists
    OUT/.prl/sets/<set-id>/sample_ids.parquet   the set's sample ids (what later builds skip)
    OUT/.prl/index.json                         one line per current set
    OUT/.prl/staging/…                          builds in progress; renamed to OUT/<set-id>/ when written
    OUT/.prl/retired/…                          sets a rebuild replaced, on their way out

Why there: ``polars.scan_parquet(SET)`` and DuckDB's ``SET/**/*.parquet`` descend into hidden folders and fail on
any file of another schema or format, so nothing but parts may live under a set folder. Everything else sits
under ``OUT/.prl/``, which ``pyarrow.dataset``, pandas and ``datasets`` skip (a leading dot) and which the globs
``OUT/*/part-*.parquet`` and ``OUT/*/*.parquet`` never reach (staged parts are two folders down). A recursive glob
over ``OUT`` (``OUT/**/*.parquet``) does reach staging and side files: list the current files with
:func:`prl.shards.listing.list_sets` (``prl shards list OUT``) instead.

An ``s3://`` OUT holds the same keys under its prefix (:mod:`prl.shards.s3out`), with no staging or retired
folder: a set is staged locally and its manifest uploaded last.

Sets written before this layout (``manifest.json`` and ``sample_ids.parquet`` inside the set folder) are still
found and read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from prl.errors import UsageError

META = ".prl"
MANIFEST = "manifest.json"
SAMPLES_FILE = "sample_ids.parquet"
INDEX = "index.json"
PART_PREFIX = "part-"


def meta_root(out: str) -> str:
    """``OUT/.prl``: everything in ``OUT`` that is not a set's rows."""
    return os.path.join(out, META)


def meta_dir(out: str, set_id: str) -> str:
    """``OUT/.prl/sets/<set-id>``: the set's manifest and sample-id file."""
    return os.path.join(out, META, "sets", set_id)


def manifest_path(out: str, set_id: str) -> str:
    return os.path.join(meta_dir(out, set_id), MANIFEST)


def samples_path(out: str, set_id: str) -> str:
    return os.path.join(meta_dir(out, set_id), SAMPLES_FILE)


def index_path(out: str) -> str:
    return os.path.join(out, META, INDEX)


def staging_root(out: str) -> str:
    """``OUT/.prl/staging``: a build writes its set here, then renames the folder to ``OUT/<set-id>``."""
    return os.path.join(out, META, "staging")


def retired_root(out: str) -> str:
    """``OUT/.prl/retired``: where replaced sets are moved before they are removed."""
    return os.path.join(out, META, "retired")


@dataclass(frozen=True)
class SetRef:
    """One complete shard set: its id, the folder of its rows and where its manifest is."""

    out: str
    set_id: str
    dir: str
    manifest_path: str
    samples_path: str
    legacy: bool = False
    """True for a set written with its manifest inside the set folder (before this layout)."""


def set_ref(out: str, set_id: str) -> SetRef | None:
    """The set ``set_id`` of ``out`` when it is complete (its folder and its manifest exist), else None."""
    folder = os.path.join(out, set_id)
    if not os.path.isdir(folder):
        return None
    path = manifest_path(out, set_id)
    if os.path.isfile(path):
        return SetRef(out, set_id, folder, path, samples_path(out, set_id))
    legacy = os.path.join(folder, MANIFEST)
    if os.path.isfile(legacy):
        return SetRef(out, set_id, folder, legacy, os.path.join(folder, SAMPLES_FILE), legacy=True)
    return None


def find_sets(out: str) -> list[SetRef]:
    """The complete shard sets of ``out``, by set id (an ``OUT`` that does not exist holds none)."""
    if not os.path.isdir(out):
        return []
    refs = [set_ref(out, name) for name in sorted(os.listdir(out)) if not name.startswith((".", "_"))]
    return [r for r in refs if r is not None]


def is_out(path: str) -> bool:
    """Whether ``path`` is an ``OUT`` folder prl has written (it has ``.prl/`` or a legacy index)."""
    return os.path.isdir(meta_root(path)) or os.path.isfile(os.path.join(path, "_index.json"))


def resolve(path: str) -> list[SetRef]:
    """The sets ``path`` names: the one set when ``path`` is a set folder, else every complete set of an
    ``OUT`` folder. Raises :class:`~prl.errors.UsageError` when it is neither."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path.rstrip(os.sep))
    own = set_ref(parent, name) if name and not name.startswith(".") else None
    if own is not None:
        return [own]
    if os.path.isdir(path):
        sets = find_sets(path)
        if sets or is_out(path):
            return sets
        raise UsageError(f"{path} holds no shard set (no set folder with a manifest)")
    raise UsageError(f"{path} is not a shard set or a folder of shard sets")


__all__ = [
    "INDEX",
    "MANIFEST",
    "META",
    "SAMPLES_FILE",
    "SetRef",
    "find_sets",
    "index_path",
    "manifest_path",
    "meta_dir",
    "resolve",
    "retired_root",
    "samples_path",
    "set_ref",
    "staging_root",
]
