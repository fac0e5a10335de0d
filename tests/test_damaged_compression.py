"""Compressed files damaged anywhere, the trailer included: every record decoded before the damage lands, the
damage is one ``truncated_input`` row, and nothing decodable is dropped."""

from __future__ import annotations

import gzip
import json
import os
import random
import zlib
from collections.abc import Callable
from typing import Any

import polars as pl
import pytest
import zstandard

from prl.ingestion.traces import ingest
from prl.io.sources import INFLATE_PIECE, LineReader, SourceFile
from tests.records import vllm_chat


def _records(count: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return b"".join(
        json.dumps(
            vllm_chat(f"d{i}", [i + 1], [([rng.randrange(1000)], [-1.0])]) | {"pad": rng.randbytes(24).hex()}
        ).encode()
        + b"\n"
        for i in range(count)
    )


def _gzip_new() -> Any:
    return zlib.decompressobj(wbits=47)


def _zstd_new() -> Any:
    return zstandard.ZstdDecompressor().decompressobj()


COMPRESS: dict[str, tuple[Callable[[bytes], bytes], Callable[[], Any], type[Exception]]] = {
    "gz": (lambda data: gzip.compress(data, mtime=0), _gzip_new, zlib.error),
    "zst": (lambda data: zstandard.ZstdCompressor(write_checksum=True).compress(data), _zstd_new, zstandard.ZstdError),
}


def _decodable(stored: bytes, new: Callable[[], Any], error: type[Exception]) -> tuple[bytes, bool]:
    """Everything a decompressor fed one byte at a time yields before its first error, and whether it failed."""
    decomp, out = new(), []
    try:
        for i in range(len(stored)):
            out.append(decomp.decompress(stored[i : i + 1]))
            if decomp.eof:
                decomp = new()
    except error:
        return b"".join(out), True
    return b"".join(out), False


def _read(path: str) -> tuple[bytes, LineReader]:
    st = os.stat(path)
    reader = LineReader(SourceFile(path, st.st_size, st.st_mtime_ns))
    return b"".join(block for _, block in reader.blocks()), reader


def _damaged(kind: str, data: bytes, offsets: list[int], tmp_path) -> list[tuple[int, str, bytes, bool]]:
    compress, new, error = COMPRESS[kind]
    stored = compress(data)
    out = []
    for offset in offsets:
        damaged = bytearray(stored)
        damaged[offset % len(stored)] ^= 0x5A
        path = tmp_path / f"damaged{offset}.jsonl.{kind}"
        path.write_bytes(bytes(damaged))
        expected, failed = _decodable(bytes(damaged), new, error)
        out.append((offset, str(path), expected, failed))
    return out


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_reader_yields_everything_decodable_at_every_offset(kind, tmp_path):
    data = _records(60, seed=1)
    stored_len = len(COMPRESS[kind][0](data))
    offsets = sorted({*range(12, stored_len, max(1, stored_len // 40)), *range(stored_len - 8, stored_len)})
    for offset, path, expected, failed in _damaged(kind, data, offsets, tmp_path):
        decoded, reader = _read(path)
        assert decoded == expected, offset
        assert (reader.truncated is not None) == (failed or not expected.endswith(data[-10:])), offset


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_damage_past_the_first_piece_keeps_the_pieces_before(kind, tmp_path):
    data = _records(5000, seed=2)
    stored_len = len(COMPRESS[kind][0](data))
    assert stored_len > 2 * INFLATE_PIECE
    offsets = [INFLATE_PIECE + 17, stored_len - 2, stored_len - 6]
    for offset, path, expected, failed in _damaged(kind, data, offsets, tmp_path):
        decoded, reader = _read(path)
        assert failed and reader.truncated is not None
        assert decoded == expected and len(decoded) > INFLATE_PIECE, offset


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_bad_trailer_loses_no_record(kind, store, tmp_path):
    """Only the checksum is wrong: all 200 records land, and the damage is one quarantine row."""
    data = _records(200, seed=3)
    stored = bytearray(COMPRESS[kind][0](data))
    stored[-6 if kind == "gz" else -2] ^= 0xFF  # gzip: CRC32 of the trailer; zstd: the content checksum
    path = tmp_path / f"trailer.jsonl.{kind}"
    path.write_bytes(bytes(stored))
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.quarantined) == (200, {"truncated_input": 1})
    assert pl.read_delta(store.table_uri("traces")).height == 200
    q = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert q["reason"] == "truncated_input" and "corrupt" in q["message"]


@pytest.mark.campaign  # long: `make test-all`
@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_every_decodable_record_lands(kind, store, tmp_path):
    data = _records(400, seed=4)
    stored_len = len(COMPRESS[kind][0](data))
    offsets = [stored_len // 5, stored_len // 2, stored_len - 40]
    for offset, path, expected, failed in _damaged(kind, data, offsets, tmp_path):
        assert failed
        result = ingest([path], store, max_quarantine_rate=None)
        lines = expected.split(b"\n")
        complete = [line for line in lines[:-1] if line]
        originals = set(data.split(b"\n"))
        intact = [json.loads(line)["id"] for line in complete if line in originals]
        landed = set(pl.read_delta(store.table_uri("traces"))["sample_id"].to_list())
        assert {f"{rid}#0" for rid in intact} <= landed, offset
        assert result.quarantined.get("truncated_input") == 1, offset
        assert result.records == len(complete) + (1 if lines[-1] else 0), offset
