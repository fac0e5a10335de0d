"""Source files: expanding files, folders, globs and ``s3://`` prefixes; reading them as numbered lines with
transparent gzip / zstd decompression and a running sha256 of the stored bytes.

Memory is bounded by one read chunk plus the longest line: nothing reads a whole file.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import stat
import time
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import zstandard

from prl.errors import RetryableIOError, UsageError
from prl.io.locations import aws_endpoint, filesystem_for
from prl.io.prefix import PrefixWindow
from prl.io.readahead import read_ahead as _read_ahead

READ_CHUNK = 4 * 1024 * 1024
INFLATE_PIECE = 64 * 1024
"""Compressed bytes per decompressor call: a damaged stream loses no output of the calls before the damage."""
READ_AHEAD_CHUNKS = 2
"""Chunks of an ``s3://`` source fetched (and hashed) ahead by a background thread, while the caller parses."""
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SKIP_NAMES = ("_SUCCESS", ".DS_Store")
PARTIAL_LINE_GRACE_S = 300.0
"""Seconds after its last change during which a plain file ending mid-line is taken to be still written
(``PRL_PARTIAL_LINE_GRACE`` overrides): its last line is left for a later run instead of quarantined."""


def partial_line_grace() -> float:
    """The grace period in seconds: ``PRL_PARTIAL_LINE_GRACE`` if set (a number ≥ 0), else 300."""
    raw = os.environ.get("PRL_PARTIAL_LINE_GRACE", "").strip()
    if not raw:
        return PARTIAL_LINE_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise UsageError(f"PRL_PARTIAL_LINE_GRACE must be a number of seconds >= 0, not {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One input file: its URI (absolute path or ``s3://bucket/key``), size in bytes and modification time
    in nanoseconds since the epoch."""

    uri: str
    size: int
    mtime_ns: int

    @property
    def identity(self) -> str:
        """``uri|size|mtime`` digest: the same file unchanged has the same identity."""
        return hashlib.sha256(f"{self.uri}|{self.size}|{self.mtime_ns}".encode()).hexdigest()[:40]

    def changed_within(self, seconds: float, now_ns: int | None = None) -> bool:
        """Whether the file was modified less than ``seconds`` ago (it may still be written)."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        return now_ns - self.mtime_ns < seconds * 1e9


def _info_to_source(uri: str, info: pafs.FileInfo) -> SourceFile:
    """An object's size and mtime. S3 gives ``LastModified`` in whole seconds on HEAD but some servers add
    milliseconds in listings: the mtime is floored to the second so both spellings give one identity."""
    mtime = int(info.mtime_ns) if info.mtime_ns is not None else 0
    return SourceFile(uri, int(info.size or 0), mtime - mtime % 1_000_000_000)


@dataclass(frozen=True, slots=True)
class SourceProblem:
    """A matched entry that is not read: ``status`` is ``skipped`` (not a regular file: a FIFO, socket or device,
    which would block a reader or never end) or ``failed`` (a dangling symlink, an entry that cannot be read or
    listed); ``reason`` says which, in words."""

    uri: str
    status: str
    reason: str


@dataclass
class Sources:
    """What ``specs`` matched: the files to read, and the entries that will not be read, with why."""

    files: list[SourceFile] = field(default_factory=list)
    problems: list[SourceProblem] = field(default_factory=list)


def scan(specs: list[str]) -> Sources:
    """Files named by ``specs``: a file, a folder (all files below it, recursively), a glob, or an ``s3://``
    key / prefix / glob. Sorted by URI within each spec; duplicates removed; hidden files skipped. Entries that
    cannot be read are :class:`SourceProblem` s, reported one by one, so one bad entry never hides the files
    beside it.

    Raises :class:`UsageError` when a spec matches nothing at all.
    """
    seen: dict[str, SourceFile] = {}
    problems: dict[str, SourceProblem] = {}
    for spec in specs:
        bad: list[SourceProblem] = []
        if spec.startswith("s3://"):
            found = _expand_remote(spec)
        else:
            found, bad = _expand_local(spec)
        if not found and not bad:
            raise UsageError(f"no input files match {spec!r}")
        for src in found:
            seen.setdefault(src.uri, src)
        for problem in bad:
            problems.setdefault(problem.uri, problem)
    return Sources(list(seen.values()), [p for uri, p in problems.items() if uri not in seen])


def expand(specs: list[str]) -> list[SourceFile]:
    """The readable files of :func:`scan` (its problems left out)."""
    return scan(specs).files


def _visible(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return not name.startswith(".") and name not in SKIP_NAMES


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _classify(path: str) -> SourceFile | SourceProblem | None:
    """A matched local path as a file to read, a problem, or None (a folder, which a glob may match)."""
    uri = os.path.abspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return SourceProblem(uri, "failed", f"dangling symlink (to {os.readlink(path)})")
        return SourceProblem(uri, "failed", "vanished while the folder was listed")
    except OSError as exc:
        return SourceProblem(uri, "failed", f"cannot read: {exc.strerror or exc}")
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a plain file")
        return SourceProblem(uri, "skipped", f"not a regular file ({kind})")
    if not os.access(path, os.R_OK):
        return SourceProblem(uri, "failed", "cannot read: permission denied")
    return SourceFile(uri, st.st_size, st.st_mtime_ns)


def _expand_local(spec: str) -> tuple[list[SourceFile], list[SourceProblem]]:
    spec = spec.removeprefix("file://")
    problems: list[SourceProblem] = []
    if any(ch in spec for ch in "*?["):
        paths = sorted(glob.glob(spec, recursive=True))
    elif os.path.isdir(spec):

        def unlisted(exc: OSError) -> None:
            where = os.path.abspath(exc.filename or spec)
            problems.append(SourceProblem(where, "failed", f"cannot list folder: {exc.strerror or exc}"))

        paths = sorted(
            os.path.join(root, name)
            for root, dirs, names in os.walk(spec, onerror=unlisted)
            for name in names
            if not any(part.startswith(".") for part in os.path.relpath(root, spec).split(os.sep) if part != ".")
        )
    elif os.path.lexists(spec):
        paths = [spec]
    else:
        return [], []
    files: list[SourceFile] = []
    for path in paths:
        if not _visible(path):
            continue
        entry = _classify(path)
        if isinstance(entry, SourceFile):
            files.append(entry)
        elif entry is not None:
            problems.append(entry)
    return files, problems


def _expand_remote(spec: str) -> list[SourceFile]:
    fs, path = filesystem_for(spec)
    pattern = None
    if any(ch in path for ch in "*?["):
        cut = min(path.index(ch) for ch in "*?[" if ch in path)
        base = path[: path.rfind("/", 0, cut)]
        pattern, path = spec[len("s3://") :], base
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File and pattern is None:
            return [_info_to_source(spec, info)]
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError as exc:
        raise RetryableIOError(f"cannot list {spec}: {exc}") from exc
    out = []
    for item in sorted(infos, key=lambda i: i.path):
        if item.type != pafs.FileType.File or not _visible(item.path):
            continue
        if pattern is not None and not fnmatch.fnmatch(item.path, pattern):
            continue
        out.append(_info_to_source(f"s3://{item.path}", item))
    if not out:
        _check_bucket(fs, spec, path.split("/", 1)[0])
    return out


def _check_bucket(fs: pafs.FileSystem, spec: str, bucket: str) -> None:
    """An empty listing of a missing bucket is an error of the storage setup (retryable), not of the spec."""
    try:
        missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError as exc:
        raise RetryableIOError(f"cannot list {spec}: {exc}") from exc
    if missing:
        where = aws_endpoint() or "the default AWS endpoint"
        raise RetryableIOError(f"cannot list {spec}: bucket {bucket!r} does not exist at {where}")


@dataclass
class LineReader:
    """Iterate a source as ``(line_number, bytes)`` pairs (1-based, without the newline).

    After iteration: ``sha256`` is the digest of the stored (possibly compressed) bytes, ``compression`` is
    ``gzip``/``zstd``/``none``, ``unterminated_line`` is the number of a last line without a newline, and
    ``held_back`` is that line's length in bytes when ``hold_partial`` kept it back (a plain file still being
    written: the line is not yielded, and the bytes consumed are ``bytes_read - held_back``), and
    ``truncated`` holds a message when a compressed stream ended early or was
    corrupt (the lines decoded before the damage were yielded; a partial last line is yielded too and its
    record will fail to parse).

    A plain source an earlier run consumed part of is read on from byte ``start`` (a line boundary), its first
    line numbered ``first_line``; ``bytes_read`` and ``sha256`` are then of the bytes from ``start`` on.
    ``whole_bytes`` counts the bytes of the whole (newline-ended) lines yielded, ``next_line`` is the number
    of the line after them, and ``window`` (when given) sees every stored byte read.
    """

    source: SourceFile
    chunk_size: int = READ_CHUNK
    sha256: str = ""
    compression: str = "none"
    truncated: str | None = None
    unterminated_line: int | None = None
    bytes_read: int = 0
    hold_partial: bool = False
    held_back: int = 0
    start: int = 0
    first_line: int = 1
    window: PrefixWindow | None = None
    whole_bytes: int = 0
    next_line: int = 1
    _hasher: hashlib._Hash = field(default_factory=hashlib.sha256, repr=False)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return lines_of(self.blocks())

    def blocks(self) -> Iterator[tuple[int, bytes]]:
        """The source as ``(number of the block's first line, bytes)`` blocks of whole lines, each ending with
        ``\\n`` except an unterminated last line (which also sets :attr:`unterminated_line`). A block is one
        read chunk or more (a line longer than a chunk is never cut); line endings are left as they are."""
        line_no = self.first_line
        parts: list[bytes] = []  # an incomplete line, as read so far
        # reading, hashing, decompressing and counting lines release the GIL: a background thread does
        # them while the caller parses (for S3, each read is a ranged GET whose latency this hides too)
        for block, newlines in _read_ahead(self._counted(), READ_AHEAD_CHUNKS):
            cut = block.rfind(b"\n") + 1
            if not cut:
                parts.append(block)
                continue
            whole = block if cut == len(block) and not parts else b"".join([*parts, memoryview(block)[:cut]])
            parts = [] if cut == len(block) else [block[cut:]]
            yield line_no, whole
            line_no += newlines  # the newlines of whole: those of block (parts hold none)
            self.whole_bytes += len(whole)
        self.next_line = line_no
        if parts:
            self.unterminated_line = line_no
            if self.hold_partial and self.compression == "none":
                self.held_back = sum(len(part) for part in parts)
            else:
                yield line_no, b"".join(parts)
        self.sha256 = self._hasher.hexdigest()

    def _counted(self) -> Generator[tuple[bytes, int], None, None]:
        """Decompressed chunks with the number of newlines in each (counted by numpy, outside the GIL)."""
        for block in self._decompressed():
            yield block, int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) == 0x0A))

    def _read_chunks(self) -> Generator[bytes, None, None]:
        fs, path = filesystem_for(self.source.uri)
        try:
            with fs.open_input_file(path) if self.start else fs.open_input_stream(path, compression=None) as stream:
                if self.start:
                    stream.seek(self.start)
                while True:
                    chunk = stream.read(self.chunk_size)
                    if not chunk:
                        return
                    self._hasher.update(chunk)
                    self.bytes_read += len(chunk)
                    if self.window is not None:
                        self.window.add(chunk)
                    yield chunk
        except FileNotFoundError as exc:
            raise RetryableIOError(f"{self.source.uri} disappeared while reading: {exc}") from exc
        except OSError as exc:
            raise RetryableIOError(f"reading {self.source.uri} failed: {exc}") from exc

    def _decompressed(self) -> Iterator[bytes]:
        chunks = self._read_chunks()
        if self.start:  # continued: a plain source (its first bytes, magic included, are what they were)
            yield from chunks
            return
        first = next(chunks, b"")
        while 0 < len(first) < len(ZSTD_MAGIC):  # the magic bytes may straddle small reads
            more = next(chunks, b"")
            if not more:
                break
            first += more
        if not first:
            return
        uri = self.source.uri.lower()
        if first.startswith(GZIP_MAGIC) or uri.endswith(".gz"):
            self.compression = "gzip"
            yield from self._gunzip(first, chunks)
        elif first.startswith(ZSTD_MAGIC) or uri.endswith((".zst", ".zstd")):
            self.compression = "zstd"
            yield from self._unzstd(first, chunks)
        else:
            yield first
            yield from chunks

    def _gunzip(self, first: bytes, chunks: Iterator[bytes]) -> Iterator[bytes]:
        yield from self._inflate(first, chunks, lambda: zlib.decompressobj(wbits=47), "gzip", zlib.error)

    def _unzstd(self, first: bytes, chunks: Iterator[bytes]) -> Iterator[bytes]:
        yield from self._inflate(
            first, chunks, lambda: zstandard.ZstdDecompressor().decompressobj(), "zstd", zstandard.ZstdError
        )

    def _inflate(
        self,
        first: bytes,
        chunks: Iterator[bytes],
        new: Callable[[], Any],
        name: str,
        error: type[Exception],
    ) -> Iterator[bytes]:
        """Decompress concatenated members/frames, fed :data:`INFLATE_PIECE` bytes at a time; a stream that ends
        inside one, or a corrupt one, sets :attr:`truncated` after yielding everything decoded before the damage
        (the output of the piece that failed is recovered by :meth:`_salvage`)."""
        decomp = new()
        inside = False
        offset = 0  # compressed bytes fed before ``piece``
        frame_start = 0  # where the current member / frame begins
        for chunk in _chain(first, chunks):
            for start in range(0, len(chunk), INFLATE_PIECE):
                piece = chunk[start : start + INFLATE_PIECE]
                while piece:
                    try:
                        out = decomp.decompress(piece)
                    except error as exc:
                        yield from self._salvage(new, error, frame_start, offset, piece)
                        self.truncated = f"{name} stream is corrupt: {exc}"
                        return
                    inside = True
                    if out:
                        yield out
                    if not decomp.eof:
                        offset += len(piece)
                        break
                    rest = decomp.unused_data  # the next member / frame starts here
                    offset += len(piece) - len(rest)
                    frame_start, piece, inside, decomp = offset, rest, False, new()
        if inside and not decomp.eof:
            tail = decomp.flush() if name == "gzip" else b""
            if tail:
                yield tail
            self.truncated = f"{name} stream ends before its end marker (truncated file)"

    def _salvage(
        self, new: Callable[[], Any], error: type[Exception], frame_start: int, offset: int, piece: bytes
    ) -> Iterator[bytes]:
        """What ``piece`` decodes to before its damage (a decompressor that raises returns nothing of the call):
        a fresh decompressor is brought to the state before ``piece`` by the member's earlier bytes, read
        again from the source, then fed ``piece`` one byte at a time until the error."""
        decomp = new()
        try:
            for block in self._reread(frame_start, offset):
                decomp.decompress(block)
            for i in range(len(piece)):
                out = decomp.decompress(piece[i : i + 1])
                if out:
                    yield out
                if decomp.eof:  # a member ended inside the piece: the damage is in the next one
                    decomp = new()
        except error:
            return

    def _reread(self, start: int, end: int) -> Iterator[bytes]:
        """The stored bytes ``[start, end)`` of the source, read again in chunks."""
        fs, path = filesystem_for(self.source.uri)
        try:
            with fs.open_input_file(path) as handle:
                handle.seek(start)
                left = end - start
                while left > 0:
                    data = handle.read(min(left, self.chunk_size))
                    if not data:
                        return
                    left -= len(data)
                    yield data
        except OSError as exc:
            raise RetryableIOError(f"reading {self.source.uri} again failed: {exc}") from exc


def lines_of(blocks: Iterable[tuple[int, bytes]], strip_cr: bool = True) -> Iterator[tuple[int, bytes]]:
    """``(line_number, line)`` pairs of blocks as :meth:`LineReader.blocks` yields them: lines without their
    ``\\n`` and (unless not ``strip_cr``) without trailing ``\\r``, blank lines included. No Python code runs
    per line."""
    for first, block in blocks:
        lines = block.split(b"\n")
        if not lines[-1]:
            lines.pop()  # the empty piece after the block's final newline
        if strip_cr and b"\r" in block:
            lines = [line.rstrip(b"\r") for line in lines]
        yield from zip(range(first, first + len(lines)), lines)


def first_lines(block: tuple[int, bytes], count: int) -> tuple[int, bytes]:
    """The first ``count`` lines of a block (as :meth:`LineReader.blocks` yields it), as a block: cut with
    ``count`` searches, so that the head of a large block is not split whole."""
    first, data = block
    end = 0
    for _ in range(count):
        end = data.find(b"\n", end) + 1
        if not end:
            return block
    return first, data[:end]


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest
