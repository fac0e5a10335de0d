"""Thrift's compact protocol, write side: the bytes of the few structures a Parquet file's page headers and footer
need (no reader, no schema; field ids and types are given by the caller, as in ``parquet.thrift``)."""

from __future__ import annotations

# type codes
TRUE, FALSE, I16, I32, I64, BINARY, LIST, STRUCT = 1, 2, 4, 5, 6, 8, 9, 12
BOOL = TRUE
"""A boolean field: its value is carried by the code (``TRUE`` or ``FALSE``), pass either with a ``bool``."""

Struct = list[tuple[int, int, object]]
"""A thrift struct to encode: ``(field id, type code, value)`` in id order; a ``None`` value is left out."""


def varint(n: int) -> bytes:
    """ULEB128 bytes of ``n`` ≥ 0 (also Parquet's RLE run headers)."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def encode(fields: Struct) -> bytes:
    """Compact-protocol bytes of a struct. Values: ``int`` (I16/I32/I64), ``bytes`` or ``str`` (BINARY),
    ``bool`` (code ``BOOL``), a :data:`Struct` (STRUCT), or ``(element code, items)`` (LIST)."""
    out = bytearray()
    last = 0
    for fid, code, value in fields:
        if value is None:
            continue
        if code == TRUE and not value:
            code = FALSE
        delta = fid - last
        if 0 < delta <= 15:
            out.append(delta << 4 | code)
        else:
            out.append(code)
            out += varint(_zigzag(fid))
        last = fid
        if code not in (TRUE, FALSE):
            out += _value(code, value)
    out.append(0)
    return bytes(out)


def _value(code: int, value: object) -> bytes:
    if code in (I16, I32, I64):
        assert isinstance(value, int)
        return varint(_zigzag(value))
    if code == BINARY:
        assert isinstance(value, (bytes, str))
        data = value.encode() if isinstance(value, str) else value
        return varint(len(data)) + data
    if code == STRUCT:
        assert isinstance(value, list)
        return encode(value)
    if code == LIST:
        assert isinstance(value, tuple)
        element, items = value
        head = bytes([len(items) << 4 | element]) if len(items) < 15 else bytes([0xF0 | element]) + varint(len(items))
        return head + b"".join(_value(element, item) for item in items)
    raise ValueError(f"thrift type code {code} is not written here")
