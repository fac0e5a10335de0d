"""Content identity of side-table events: what ``rewards.event_id`` and ``ref_logprobs.event_id`` hold.

A reward event is its sample, name, value and event time as the source wrote it (none when the row had no
``created_at``: the ingest time that fills it in is not part of the event); a reference row is its sample,
reference model and logprobs (float32). Identical events of one file are told apart by their occurrence: the
n-th identical event of a file (n = 0, 1, …, in file order) has its own id. So a file read again (a rerun, a
grown file, a rotated file holding earlier lines, a renamed copy) yields the ids already stored for what it
held before and new ids for everything new, wherever its lines moved. An id is the 128-bit blake2b of that
content, as 32 hex digits.

One limit follows from identity by content: the n-th occurrence of an event without a time in one file and the
n-th identical one in another file are one event. Events meant as separate facts should carry ``created_at``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEP = b"\x1f"
_COUNT = struct.Struct(">I")
_RECORD = 16 + _COUNT.size


def _digest(content: bytes) -> str:
    return hashlib.blake2b(content, digest_size=16).hexdigest()


def reward_content(sample_id: str, name: str, value: float, created_ms: int | None) -> bytes:
    """The bytes a reward event is identified by (value as its IEEE-754 float64 bits)."""
    stamp = b"-" if created_ms is None else str(created_ms).encode()
    return SEP.join([b"reward", sample_id.encode(), name.encode(), struct.pack(">d", value), stamp])


def ref_content(sample_id: str, ref_model: str, ref_logprobs_T: np.ndarray) -> bytes:
    """The bytes a reference row is identified by (logprobs as little-endian float32)."""
    values = np.ascontiguousarray(ref_logprobs_T, dtype="<f4").tobytes()
    return SEP.join([b"ref", sample_id.encode(), ref_model.encode(), values])


def _occurrence_id(content: bytes, n: int) -> str:
    return _digest(hashlib.blake2b(content, digest_size=16).digest() + SEP + str(n).encode())


def reward_id(sample_id: str, name: str, value: float, created_ms: int | None) -> str:
    """The ``event_id`` of a reward event that occurs once in its source (a reward a trace record carries)."""
    return _occurrence_id(reward_content(sample_id, name, value, created_ms), 0)


class Occurrences:
    """Event ids of one file, in file order: each content with the number of identical contents before it.

    Memory: one counter entry per distinct event of the file (its 16-byte digest)."""

    def __init__(self) -> None:
        self._seen: dict[bytes, int] = {}

    def __len__(self) -> int:
        """Distinct contents seen."""
        return len(self._seen)

    def to_json(self) -> str:
        """The counts so far as base64 of sorted 20-byte records (16-byte content digest, big-endian uint32
        count): what a resume point of the file carries, so a read continued there numbers on."""
        n = len(self._seen)
        keys = np.frombuffer(b"".join(self._seen), dtype=">u8").reshape(n, 2)  # 16 bytes as two big-endian words
        order = np.lexsort((keys[:, 1], keys[:, 0]))  # byte order, as sorting the keys as bytes gives
        records = np.empty(n, dtype=[("key", ">u8", (2,)), ("count", ">u4")])
        records["key"] = keys[order]
        records["count"] = np.fromiter(self._seen.values(), dtype=np.int64, count=n)[order]
        return base64.b64encode(records.tobytes()).decode("ascii")

    @classmethod
    def from_json(cls, text: object) -> Occurrences | None:
        """The counts :meth:`to_json` wrote; None for anything else (a damaged entry)."""
        if not isinstance(text, str):
            return None
        try:
            raw = base64.b64decode(text, validate=True)
        except (ValueError, binascii.Error):
            return None
        if len(raw) % _RECORD:
            return None
        occurrences = cls()
        view = memoryview(raw)
        for at in range(0, len(raw), _RECORD):
            occurrences._seen[bytes(view[at : at + 16])] = _COUNT.unpack_from(view, at + 16)[0]
        return occurrences

    def ids(self, contents: Iterable[bytes]) -> list[str]:
        keys = [hashlib.blake2b(content, digest_size=16).digest() for content in contents]
        seen = self._seen
        nth = []
        for key in keys:
            n = seen.get(key, 0)
            seen[key] = n + 1
            nth.append(n)
        if not any(nth):  # the usual case: every event new to the file
            return [hashlib.blake2b(key + _FIRST, digest_size=16).hexdigest() for key in keys]
        return [_digest(key + SEP + str(n).encode()) for key, n in zip(keys, nth, strict=True)]


_FIRST = SEP + b"0"


def reward_contents(batch: pa.RecordBatch, stamped: np.ndarray) -> list[bytes]:
    """:func:`reward_content` of each row of a ``rewards`` batch without nulls, computed over the columns;
    ``stamped`` (bool[N]): row i's time came from the source."""
    n = batch.num_rows
    value = np.ascontiguousarray(batch.column("value").to_numpy(zero_copy_only=False), dtype=">f8")
    bits = pa.Array.from_buffers(pa.binary(8), n, [None, pa.py_buffer(value.tobytes())]).cast(pa.binary())
    created = batch.column("created_at").cast(pa.int64()).cast(pa.string()).cast(pa.binary())
    stamp = pc.if_else(pa.array(np.asarray(stamped, dtype=bool)), created, pa.scalar(b"-", pa.binary()))
    joined = pc.binary_join_element_wise(
        pa.scalar(b"reward", pa.binary()),
        batch.column("sample_id").cast(pa.binary()),
        batch.column("name").cast(pa.binary()),
        bits,
        stamp,
        pa.scalar(SEP, pa.binary()),
    )
    return joined.to_pylist()


def reward_ids(batch: pa.RecordBatch, stamped: np.ndarray | list[bool], occurrences: Occurrences) -> pa.Array:
    """``event_id`` of each row of a ``rewards`` batch (string[N]); ``stamped[i]``: row i's time came from the
    source (else it is the ingest time and not part of the event)."""
    return pa.array(occurrences.ids(reward_contents(batch, np.asarray(stamped, dtype=bool))), pa.string())


def ref_id(sample_id: str, ref_model: str, ref_logprobs_T: np.ndarray) -> str:
    """The ``event_id`` of one reference row."""
    return _digest(ref_content(sample_id, ref_model, ref_logprobs_T))


def ref_ids(sample_ids: list[str], models: list[str], ref_logprobs: pa.Array) -> pa.Array:
    """``event_id`` of reference rows (string[N]): identical rows are one event, so no occurrence count. The
    contents (:func:`ref_content`) are assembled over the columns; only the digest is taken row by row."""
    n = len(sample_ids)
    offsets = ref_logprobs.offsets.to_numpy().astype(np.int64)  # of the slice, if it is one
    values = ref_logprobs.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    raw = np.ascontiguousarray(values, dtype="<f4").tobytes()
    byte_offsets = pa.py_buffer(((offsets - offsets[0]) * 4).astype(np.int64).tobytes())
    floats = pa.Array.from_buffers(pa.large_binary(), n, [None, byte_offsets, pa.py_buffer(raw)])
    contents = pc.binary_join_element_wise(
        pa.scalar(b"ref", pa.large_binary()),
        pa.array(sample_ids, pa.string()).cast(pa.large_binary()),
        pa.array(models, pa.string()).cast(pa.large_binary()),
        floats,
        pa.scalar(SEP, pa.large_binary()),
    )
    return pa.array([_digest(content) for content in contents.to_pylist()], pa.string())


__all__ = [
    "Occurrences",
    "ref_content",
    "ref_id",
    "ref_ids",
    "reward_content",
    "reward_contents",
    "reward_id",
    "reward_ids",
]
