"""``prl verify SHARDS``: recompute every shard's sha256, size, rows and tokens and compare with its manifest.

``SHARDS`` is one shard set or an ``OUT`` folder (every set in it), local or ``s3://`` (each set of an S3 OUT is
downloaded to a temporary folder and checked there, one set at a time). For each
shard the manifest names: the file exists, its byte size and sha256 match, its Parquet row count matches ``rows``,
and Σ len(input_ids) matches ``tokens`` (streamed one record batch at a time; only ``input_ids`` is read). The
sample-id file is checked the same way, and every sample id appears in exactly one shard set of ``OUT``.
Leftover ``*.tmp`` files inside a published set are reported too. For an ``OUT``, ``.prl/index.json`` must be the
index of its sets' manifests (:func:`prl.shards.index.index_json`): a build killed before it wrote the index
leaves it a line short until the next build that publishes, and builds keep the lines already there, so one
edited by hand stays wrong until it is removed. Any problem → exit 1, naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prl.errors import ExitCode
from prl.io.locations import S3_SCHEME
from prl.shards.index import index_json
from prl.shards.layout import INDEX, MANIFEST, SAMPLES_FILE, SetRef, index_path, resolve, set_ref
from prl.shards.manifest import FileEntry, Manifest, ManifestError
from prl.shards.publish import sha256_file
from prl.shards.writer import read_ipc

if TYPE_CHECKING:
    from prl.shards.s3out import S3Out  # loaded where an s3:// OUT is used: boto3 only then

BATCH_ROWS = 1024
META_FOLDER = "meta"
"""What a problem of the meta folder beside OUT (:func:`prl.shards.layout.meta_root`) names as its set."""


@dataclass
class Problem:
    """One mismatch: which set and file, and what differs."""

    set_id: str
    file: str
    problem: str


@dataclass
class VerifyResult:
    """Outcome of :func:`verify_shards`; ``exit_code`` is 1 on any problem."""

    path: str
    sets: list[str] = field(default_factory=list)
    shards: int = 0
    rows: int = 0
    tokens: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> int:
        return int(ExitCode.OK if self.ok else ExitCode.DATA_PROBLEMS)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "command": "verify", "ok": self.ok, "exit_code": self.exit_code}

    def headline(self) -> str:
        """``verify ok: 2 set(s), 5 shards, 120 rows, 48,000 tokens in OUT`` (or ``verify: 1 problem(s): …``)."""
        status = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        return (
            f"verify {status}: {len(self.sets)} set(s), {self.shards:,} shards, {self.rows:,} rows, "
            f"{self.tokens:,} tokens in {self.path}"
        )


def set_dirs(path: str) -> list[str]:
    """The shard-set folders ``path`` names: itself when it is a set, else the sets of an ``OUT`` folder
    (:func:`prl.shards.layout.resolve`). Raises :class:`UsageError` when it is neither."""
    return [ref.dir for ref in resolve(path)]


def _count_tokens(path: str) -> tuple[int, int]:
    """(rows, Σ len(input_ids)) of a shard, reading only ``input_ids``, one batch at a time."""
    parquet = pq.ParquetFile(path)
    tokens = 0
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=["input_ids"]):
        tokens += int(pc.sum(pc.list_value_length(batch.column(0))).as_py() or 0)
    return parquet.metadata.num_rows, tokens


def _check_file(set_id: str, folder: str, entry: FileEntry, result: VerifyResult) -> bool:
    """Existence, size and sha256 of one file the manifest names; appends problems, True when all match."""
    path = os.path.join(folder, entry.file)
    if not os.path.isfile(path):
        result.problems.append(Problem(set_id, entry.file, "missing"))
        return False
    size = os.path.getsize(path)
    if size != entry.bytes:
        result.problems.append(Problem(set_id, entry.file, f"size {size} != manifest {entry.bytes}"))
        return False
    digest = sha256_file(path)
    if digest != entry.sha256:
        result.problems.append(Problem(set_id, entry.file, f"sha256 {digest} != manifest {entry.sha256}"))
        return False
    return True


def _check_shard(set_id: str, folder: str, entry: FileEntry, result: VerifyResult) -> None:
    """A shard's bytes, then its Parquet row count and Σ len(input_ids) against the manifest."""
    if not _check_file(set_id, folder, entry, result):
        return
    result.bytes += entry.bytes
    try:
        rows, tokens = _count_tokens(os.path.join(folder, entry.file))
    except (OSError, ValueError) as exc:
        result.problems.append(Problem(set_id, entry.file, f"unreadable Parquet: {exc}"))
        return
    result.rows += rows
    result.tokens += tokens
    if rows != entry.rows:
        result.problems.append(Problem(set_id, entry.file, f"rows {rows} != manifest {entry.rows}"))
    if tokens != entry.tokens:
        result.problems.append(Problem(set_id, entry.file, f"tokens {tokens} != manifest {entry.tokens}"))


def verify_set(ref: SetRef, result: VerifyResult) -> Manifest | None:
    """Verify one shard set into ``result``; its manifest (None when it cannot be read)."""
    set_id, folder = ref.set_id, ref.dir
    try:
        manifest = Manifest.of(ref)
    except (OSError, ManifestError) as exc:
        result.problems.append(Problem(set_id, MANIFEST, f"unreadable: {exc}"))
        return None
    result.sets.append(set_id)
    if manifest.set_id != set_id:
        result.problems.append(Problem(set_id, MANIFEST, f"set_id {manifest.set_id!r} != folder name"))
    listed = {e.file for e in manifest.shards}
    for name in sorted(os.listdir(folder)):
        if ".tmp" in name:
            result.problems.append(Problem(set_id, name, "leftover temporary file in a published set"))
        elif name not in listed:
            result.problems.append(Problem(set_id, name, "a file the manifest does not name, in the set folder"))
    for entry in manifest.shards:
        result.shards += 1
        _check_shard(set_id, folder, entry, result)
    samples = manifest.samples
    samples_dir = os.path.dirname(ref.samples_path)
    if _check_file(set_id, samples_dir, samples, result):
        rows = read_ipc(os.path.join(samples_dir, samples.file)).num_rows
        if rows != samples.rows:
            result.problems.append(Problem(set_id, samples.file, f"rows {rows} != manifest {samples.rows}"))
    return manifest


def _check_index(raw: bytes | None, manifests: list[Manifest | None], result: VerifyResult) -> None:
    """``OUT/.prl/index.json`` (``raw``, its bytes; None when missing) against the index of the sets' manifests
    (not checked when one of them cannot be read: that is reported already)."""
    if any(m is None for m in manifests):
        return
    expected = index_json([m for m in manifests if m is not None])
    try:
        found = None if raw is None else json.loads(raw)
    except ValueError:
        found = None
    if raw is None:
        result.problems.append(Problem(META_FOLDER, INDEX, "missing: the next build that publishes a set writes it"))
    elif found != expected:
        problem = "not the index of the sets' manifests: remove it, and the next build that publishes a set writes it"
        result.problems.append(Problem(META_FOLDER, INDEX, f"{problem} from every manifest"))


def _shipped_twice(refs: list[SetRef], result: VerifyResult) -> None:
    """Sample ids that appear in more than one set's sample-id file (a streaming polars group-by)."""
    frames = []
    for ref in refs:
        if os.path.isfile(ref.samples_path):
            frames.append(pl.scan_ipc(ref.samples_path).select("sample_id", pl.lit(ref.set_id).alias("set")))
    if len(frames) < 2:
        return
    twice = (
        pl.concat(frames)
        .group_by("sample_id")
        .agg(pl.col("set").sort())
        .filter(pl.col("set").list.len() > 1)
        .sort("sample_id")
        .head(20)
        .collect(engine="streaming")
    )
    for sid, sets in twice.iter_rows():
        result.problems.append(Problem(sets[-1], SAMPLES_FILE, f"sample {sid} shipped in {', '.join(sets)}"))


def _stray_parquet(out: str, refs: list[SetRef], result: VerifyResult) -> None:
    """Every ``*.parquet`` file under ``out`` (hidden folders too, as DuckDB's and polars' recursive globs read
    them) must be a part of a current set: any other would be read as rows by such a reader."""
    sets = {ref.set_id for ref in refs}
    for root, _, names in os.walk(out):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), out)
            if name.endswith(".parquet") and os.path.dirname(rel) not in sets:
                result.problems.append(Problem("OUT", rel, "a Parquet file of no current set, read by recursive globs"))


def verify_shards(path: str) -> VerifyResult:
    """Verify a shard set, or every set of an ``OUT`` folder or ``s3://`` OUT (see the module docstring)."""
    if path.startswith(S3_SCHEME):
        from prl.shards.s3out import S3Out

        return _verify_s3(S3Out(path))
    path = os.path.abspath(path)
    result = VerifyResult(path=path)
    refs = resolve(path)
    manifests = [verify_set(ref, result) for ref in refs]
    _shipped_twice(refs, result)
    if all(ref.out == path for ref in refs):  # an OUT, not one set of it
        _stray_parquet(path, refs, result)
    if refs and all(ref.out == path for ref in refs):
        try:
            with open(index_path(path), "rb") as fh:
                raw: bytes | None = fh.read()
        except FileNotFoundError:
            raw = None
        _check_index(raw, manifests, result)
    return result


__all__ = ["Problem", "VerifyResult", "set_dirs", "verify_set", "verify_shards"]


def _verify_s3(remote: S3Out) -> VerifyResult:
    """Verify the sets an ``s3://`` URI names: each set is downloaded into a local folder in the same layout,
    verified there and its parts removed; the sample-id files stay until every set is checked for samples shipped
    twice."""
    result = VerifyResult(path=remote.uri)
    local_refs: list[SetRef] = []
    manifests: list[Manifest | None] = []
    refs = remote.resolve()
    with tempfile.TemporaryDirectory(prefix="prl-verify-") as scratch:
        local_out = os.path.join(scratch, "out")  # its meta folder goes beside it, inside the scratch folder
        for ref in refs:
            from prl.shards.s3out import S3Out

            S3Out(ref.out).download_set(ref.set_id, local_out)
            local = set_ref(local_out, ref.set_id)
            if local is None:
                result.problems.append(Problem(ref.set_id, MANIFEST, "vanished while it was read"))
                continue
            manifests.append(verify_set(local, result))
            shutil.rmtree(local.dir, ignore_errors=True)
            os.makedirs(local.dir)  # an empty folder keeps the set's ref valid for the check below
            local_refs.append(local)
        _shipped_twice(local_refs, result)
    if refs and all(ref.out == remote.uri for ref in refs):  # an OUT, not one set of it
        _check_index(remote.read_if_any(remote.mkey(INDEX)), manifests, result)
    return result
