"""``prl shards list OUT``: the part files of the current complete shard sets, what a trainer should read (a local
OUT folder or an ``s3://`` OUT, :mod:`prl.shards.s3out`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from prl.errors import ExitCode
from prl.io.locations import S3_SCHEME
from prl.shards.layout import resolve
from prl.shards.manifest import Manifest


@dataclass
class SetListing:
    """One current set: its folder, totals, and its parts (absolute paths, manifest order)."""

    set_id: str
    dir: str
    rows: int
    tokens: int
    files: list[str]


@dataclass
class ShardList:
    """The current complete sets of ``out``; :attr:`files` is every part of every set."""

    out: str
    sets: list[SetListing] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        return [f for s in self.sets for f in s.files]

    @property
    def exit_code(self) -> int:
        return int(ExitCode.OK)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "shards list",
            "out": self.out,
            "sets": [vars(s) for s in self.sets],
            "files": self.files,
            "rows": sum(s.rows for s in self.sets),
            "exit_code": self.exit_code,
        }

    def headline(self) -> str:
        """``shards list: 2 set(s), 5 files, 120 rows in OUT``."""
        rows = sum(s.rows for s in self.sets)
        return f"shards list: {len(self.sets)} set(s), {len(self.files)} files, {rows:,} rows in {self.out}"


def list_sets(path: str) -> ShardList:
    """The files of the current complete sets of an ``OUT`` folder or ``s3://`` prefix (or of one set), as paths
    or ``s3://`` URIs. Staged builds, retired sets, uploads without a manifest and side files are never listed.
    Raises :class:`~prl.errors.UsageError` when ``path`` holds no set."""
    if path.startswith(S3_SCHEME):
        from prl.shards.s3out import S3Out

        remote = S3Out(path)
        result = ShardList(out=remote.uri)
        for ref in remote.resolve():
            from prl.shards.s3out import S3Out

            manifest = S3Out(ref.out).manifest(ref.set_id)
            files = [f"{ref.dir}/{entry.file}" for entry in manifest.shards]
            result.sets.append(SetListing(ref.set_id, ref.dir, manifest.totals.rows, manifest.totals.tokens, files))
        return result
    path = os.path.abspath(path)
    result = ShardList(out=path)
    for ref in resolve(path):
        manifest = Manifest.of(ref)
        result.sets.append(
            SetListing(ref.set_id, ref.dir, manifest.totals.rows, manifest.totals.tokens, manifest.part_paths(ref))
        )
    return result


__all__ = ["SetListing", "ShardList", "list_sets"]
