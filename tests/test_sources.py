"""Reading sources as blocks of whole lines and as numbered lines, whatever the read chunk size, the line
endings and the compression: the same lines, numbers, digest and unterminated last line as a plain split."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from prl.io.sources import GZIP_MAGIC, ZSTD_MAGIC, LineReader, expand, first_lines

PROPS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)

line_texts = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"x")) | st.sampled_from([b"", b"\r", b"a\r"])


def _expected(data: bytes) -> tuple[list[tuple[int, bytes]], int | None]:
    """Numbered lines of ``data`` without their newline and trailing CRs, and its unterminated last line."""
    pieces = data.split(b"\n")
    unterminated = len(pieces) if pieces[-1] else None
    if not pieces[-1]:
        pieces.pop()
    return [(i, p.rstrip(b"\r")) for i, p in enumerate(pieces, start=1)], unterminated


def _stored(tmp_path: Path, data: bytes, compression: str) -> tuple[Path, bytes]:
    path = tmp_path / f"source.{compression}"
    stored = {"none": data, "gzip": gzip.compress(data), "zstd": zstandard.ZstdCompressor().compress(data)}
    path.write_bytes(stored[compression])
    return path, stored[compression]


@PROPS
@given(
    lines=st.lists(line_texts, max_size=30),
    terminated=st.booleans(),
    chunk_size=st.integers(1, 40),
    compression=st.sampled_from(["none", "gzip", "zstd"]),
)
def test_lines_and_blocks_match_a_plain_split(tmp_path, lines, terminated, chunk_size, compression):
    data = b"\n".join(lines) + (b"\n" if terminated and lines else b"")
    assume(compression != "none" or not data.startswith((GZIP_MAGIC, ZSTD_MAGIC)))  # read as compressed: below
    path, stored = _stored(tmp_path, data, compression)
    (src,) = expand([str(path)])
    expected, unterminated = _expected(data)

    reader = LineReader(src, chunk_size=chunk_size)
    assert list(reader) == expected
    assert reader.unterminated_line == unterminated
    assert reader.sha256 == hashlib.sha256(stored).hexdigest()

    reader = LineReader(src, chunk_size=chunk_size)
    blocks = list(reader.blocks())
    assert b"".join(block for _, block in blocks) == data
    assert all(block.endswith(b"\n") for _, block in blocks[:-1])  # a line is never cut
    numbers = [1 + sum(block.count(b"\n") for _, block in blocks[:i]) for i in range(len(blocks))]
    assert [first for first, _ in blocks] == numbers


def test_first_lines_cuts_a_block_after_its_first_lines():
    block = (7, b"a\nb\n\nc\n")
    assert first_lines(block, 2) == (7, b"a\nb\n")
    assert first_lines(block, 3) == (7, b"a\nb\n\n")
    assert first_lines(block, 4) == block
    assert first_lines(block, 10) == block
    assert first_lines((1, b"no newline"), 1) == (1, b"no newline")
    assert first_lines(block, 0) == (7, b"")


@pytest.mark.parametrize("data", [GZIP_MAGIC, GZIP_MAGIC + b'{"a": 1}\n', ZSTD_MAGIC + b"xyz\n"])
def test_an_uncompressed_file_opening_with_a_magic_number_is_reported_not_read_as_lines(tmp_path, data):
    # no JSON line starts with these bytes: the file is taken as compressed, and its damage is reported
    path = tmp_path / "source.jsonl"
    path.write_bytes(data)
    (src,) = expand([str(path)])
    reader = LineReader(src, chunk_size=3)
    assert list(reader) == []
    assert reader.compression == ("gzip" if data.startswith(GZIP_MAGIC) else "zstd")
    assert reader.truncated is not None and reader.truncated.startswith(f"{reader.compression} stream")
