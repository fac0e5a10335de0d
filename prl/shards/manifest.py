"""A shard set's ``manifest.json`` as a typed :class:`Manifest` (docs/design.md), and the sets of ``OUT``.

Where a set's files live is :mod:`prl.shards.layout`; the manifest is written last, after every file it names. :meth:`Manifest.to_json` is exactly the JSON object written;
:meth:`Manifest.from_json` reads one back and raises :class:`ManifestError` (a ``ValueError`` and a usage error, exit 2) naming the first key
that is missing or of the wrong kind. Readers (verify, inspect, export) take a :class:`Manifest`, never the dict.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from prl.errors import UsageError
from prl.shards.layout import INDEX, MANIFEST, SAMPLES_FILE, SetRef, find_sets, manifest_path, set_ref

FORMAT = "prl.shards"


class ManifestError(UsageError, ValueError):
    """A manifest that is not valid JSON or lacks a key (the message names it). Exit 2 where a command meets
    one: a build stops before it publishes anything; ``prl verify`` reports it as the set's failure."""


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise ManifestError(f"{where}: missing {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


@dataclass(frozen=True)
class FileEntry:
    """One file of a set: name inside the set folder, rows, bytes and hex sha256. Shards also carry their
    ``groups``, ``tokens`` (Σ len(input_ids)) and ``completion_tokens`` (Σ len(loss_mask)); the sample-id file
    carries none of those (None)."""

    file: str
    rows: int
    bytes: int
    sha256: str
    groups: int | None = None
    tokens: int | None = None
    completion_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str) -> FileEntry:
        optional = {k: _get(obj, k, int, where) for k in ("groups", "tokens", "completion_tokens") if k in obj}
        return cls(
            file=_get(obj, "file", str, where),
            rows=_get(obj, "rows", int, where),
            bytes=_get(obj, "bytes", int, where),
            sha256=_get(obj, "sha256", str, where),
            **optional,
        )


@dataclass(frozen=True)
class Totals:
    """Sums over a set's shards."""

    rows: int
    groups: int
    tokens: int
    completion_tokens: int
    shards: int


@dataclass(frozen=True)
class Manifest:
    """What a shard set holds and how it was made. ``options`` is :meth:`ShardOptions.to_dict`; ``statistics``,
    ``heads`` and ``conventions`` are free-form summaries for people and trainers (their keys are listed in the
    README)."""

    set_id: str
    schema_version: str
    columns: list[str]
    options: dict[str, Any]
    options_sha256: str
    source_versions: dict[str, int | None]
    current_version: int | None
    excluded_sets: list[str]
    shuffle: dict[str, Any]
    shards: list[FileEntry]
    samples: FileEntry
    totals: Totals
    heads: dict[str, Any]
    statistics: dict[str, Any]
    drops: dict[str, int]
    conventions: dict[str, Any]
    sampling: dict[str, Any] = field(default_factory=dict)
    """Sampling settings and policy versions of the shipped rows (:func:`prl.shards.statistics.sampling_summary`)."""
    check_reasons: dict[str, int] = field(default_factory=dict)
    """Shipped samples per token-check reason (the ``note`` reasons a build keeps; docs/verdicts.md)."""

    @property
    def kl(self) -> str:
        """Where KL went (``none``, ``column``, ``reward``, ``advantages``)."""
        return str(self.options.get("kl", "none"))

    @property
    def topk(self) -> int | None:
        """k of the shipped top-k heads (None without heads)."""
        k = self.heads.get("k")
        return int(k) if k is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schema_version": self.schema_version,
            "set_id": self.set_id,
            "columns": self.columns,
            "options": self.options,
            "options_sha256": self.options_sha256,
            "source": {"versions": self.source_versions, "current_version": self.current_version},
            "excluded_sets": self.excluded_sets,
            "shuffle": self.shuffle,
            "shards": [e.to_json() for e in self.shards],
            "samples": self.samples.to_json(),
            "totals": asdict(self.totals),
            "heads": self.heads,
            "statistics": self.statistics,
            "drops": self.drops,
            "conventions": self.conventions,
            "sampling": self.sampling,
            "check_reasons": self.check_reasons,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = MANIFEST) -> Manifest:
        """The manifest in a parsed ``manifest.json``; :class:`ManifestError` on a missing or mistyped key."""
        if not isinstance(obj, Mapping):
            raise ManifestError(f"{where}: expected a JSON object")
        if obj.get("format", FORMAT) != FORMAT:
            raise ManifestError(f"{where}: format {obj.get('format')!r} is not {FORMAT!r}")
        source = _get(obj, "source", Mapping, where)
        totals = _get(obj, "totals", Mapping, where)
        shards = _get(obj, "shards", list, where)
        return cls(
            set_id=_get(obj, "set_id", str, where),
            schema_version=str(_get(obj, "schema_version", (str, int), where)),
            columns=list(_get(obj, "columns", list, where)),
            options=dict(_get(obj, "options", Mapping, where)),
            options_sha256=_get(obj, "options_sha256", str, where),
            source_versions=dict(_get(source, "versions", Mapping, f"{where} source")),
            current_version=source.get("current_version"),
            excluded_sets=list(obj.get("excluded_sets", [])),
            shuffle=dict(obj.get("shuffle", {})),
            shards=[FileEntry.from_json(e, f"{where} shards[{i}]") for i, e in enumerate(shards)],
            samples=FileEntry.from_json(_get(obj, "samples", Mapping, where), f"{where} samples"),
            totals=Totals(**{k: _get(totals, k, int, f"{where} totals") for k in Totals.__dataclass_fields__}),
            heads=dict(obj.get("heads", {})),
            statistics=dict(obj.get("statistics", {})),
            drops={str(k): int(v) for k, v in dict(obj.get("drops", {})).items()},
            conventions=dict(obj.get("conventions", {})),
            sampling=dict(obj.get("sampling", {})),
            check_reasons={str(k): int(v) for k, v in dict(obj.get("check_reasons", {})).items()},
        )

    @classmethod
    def read_file(cls, path: str) -> Manifest:
        """The manifest in the file ``path``; ``OSError`` when unreadable, :class:`ManifestError` when malformed."""
        with open(path, encoding="utf-8") as fh:
            try:
                obj = json.load(fh)
            except ValueError as exc:
                raise ManifestError(f"{path}: not JSON: {exc}") from None
        return cls.from_json(obj, path)

    @classmethod
    def read(cls, folder: str) -> Manifest:
        """The manifest of the set whose rows are in ``folder`` (``OUT/<set-id>``)."""
        parent, name = os.path.split(os.path.abspath(folder).rstrip(os.sep))
        ref = set_ref(parent, name)
        return cls.read_file(ref.manifest_path if ref is not None else manifest_path(parent, name))

    @classmethod
    def of(cls, ref: SetRef) -> Manifest:
        """The manifest of the set ``ref`` (:func:`prl.shards.layout.resolve`)."""
        return cls.read_file(ref.manifest_path)

    def part_paths(self, ref: SetRef) -> list[str]:
        """Absolute paths of the set's Parquet parts, in manifest order."""
        return [os.path.join(ref.dir, entry.file) for entry in self.shards]


def existing_sets(out: str) -> list[Manifest]:
    """Manifests of the complete shard sets in ``out`` (:func:`prl.shards.layout.find_sets`), by set id."""
    return [Manifest.of(ref) for ref in find_sets(out)]


__all__ = [
    "FORMAT",
    "INDEX",
    "MANIFEST",
    "SAMPLES_FILE",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "Totals",
    "existing_sets",
]
