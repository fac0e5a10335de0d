"""Whether a plain source still begins with the bytes an earlier run consumed.

A consumed prefix is named by its length and the sha256 of its first and last :data:`BLOCK_BYTES` (the two
overlap, or are one, in a prefix shorter than two blocks): :class:`PrefixWindow` keeps the bytes a reader has
seen near the source's start and near where it stopped, so the digests are of the very bytes it parsed;
:func:`matching_prefix` reads the two blocks again (two ranged reads) and compares. A log that only grew
matches; a rotated, truncated or rewritten one does not (unless it is rewritten with the same first and last
blocks of the prefix, which a log of timestamped records with request IDs is not).
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any

from prl.errors import RetryableIOError
from prl.io.locations import filesystem_for

BLOCK_BYTES = 4096


def block_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class PrefixDigest:
    """A source's first ``length`` bytes, by the sha256 (hex) of their first and last ``block`` bytes."""

    length: int
    block: int
    head: str
    tail: str

    def to_json(self) -> dict[str, Any]:
        return {"length": self.length, "block": self.block, "head_sha256": self.head, "tail_sha256": self.tail}

    @classmethod
    def from_json(cls, obj: Any) -> PrefixDigest | None:
        """The digest a ledger recorded; None for anything else (an older or damaged entry)."""
        if not isinstance(obj, dict):
            return None
        length, block, head, tail = (obj.get(k) for k in ("length", "block", "head_sha256", "tail_sha256"))
        if type(length) is not int or type(block) is not int or length <= 0 or block <= 0:
            return None
        if not isinstance(head, str) or not isinstance(tail, str):
            return None
        return cls(length, block, head, tail)


class PrefixWindow:
    """The bytes a reader saw near a plain source's start (its first ``block`` bytes) and near where it stopped
    (at least the last ``keep`` bytes read, in the chunks read), by offset in the source. Memory: ``block`` bytes
    and references to the last chunks read."""

    def __init__(self, block: int = BLOCK_BYTES, keep: int = 8 * 1024 * 1024) -> None:
        self.block = block
        self.keep = keep
        self.head = bytearray()
        self.end = 0
        """Offset just past the last byte seen."""
        self._recent: deque[tuple[int, bytes]] = deque()

    def seed(self, head: bytes, tail: bytes, end: int) -> None:
        """Bytes verified before a read continues at ``end``: the source's first bytes and those just before ``end``."""
        self.head = bytearray(head[: self.block])
        self._recent = deque([(end - len(tail), tail)])
        self.end = end

    def add(self, chunk: bytes) -> None:
        """The next bytes read, at :attr:`end`."""
        if len(self.head) < self.block and self.end == len(self.head):
            self.head += chunk[: self.block - len(self.head)]
        self._recent.append((self.end, chunk))
        self.end += len(chunk)
        while len(self._recent) > 1 and self.end - self._recent[1][0] >= self.keep:
            self._recent.popleft()

    def digest(self, length: int) -> PrefixDigest | None:
        """The digest of the source's first ``length`` bytes; None when nothing was consumed, the prefix does not
        end with a newline, or its last block is no longer (or was never) in the window."""
        size = min(self.block, length)
        if length <= 0 or length > self.end or len(self.head) < size:
            return None
        tail = self._span(length - size, length)
        if tail is None or not tail.endswith(b"\n"):
            return None
        return PrefixDigest(length, self.block, block_digest(bytes(self.head[:size])), block_digest(tail))

    def _span(self, start: int, end: int) -> bytes | None:
        if not self._recent or self._recent[0][0] > start:
            return None
        parts = [
            data[max(0, start - at) : end - at] for at, data in self._recent if at < end and at + len(data) > start
        ]
        return b"".join(parts)


def matching_prefix(uri: str, size: int, digest: PrefixDigest) -> tuple[bytes, bytes] | None:
    """The first and last blocks of the source's first ``digest.length`` bytes when they are still the bytes
    ``digest`` names (two ranged reads); None when the source (of ``size`` bytes) is shorter or they differ."""
    if size < digest.length:
        return None
    block = min(digest.block, digest.length)
    fs, path = filesystem_for(uri)
    try:
        with fs.open_input_file(path) as handle:
            head = handle.read_at(block, 0)
            tail = head if digest.length == block else handle.read_at(block, digest.length - block)
    except FileNotFoundError as exc:
        raise RetryableIOError(f"{uri} disappeared while reading: {exc}") from exc
    except OSError as exc:
        raise RetryableIOError(f"reading {uri} failed: {exc}") from exc
    if block_digest(head) != digest.head or block_digest(tail) != digest.tail:
        return None
    return head, tail


__all__ = ["BLOCK_BYTES", "PrefixDigest", "PrefixWindow", "block_digest", "matching_prefix"]
