"""Thrift compact protocol bytes, checked against hand-encoded examples of each rule."""

from __future__ import annotations

from prl.shards import thrift_compact as thrift


def test_varint():
    assert [thrift.varint(n) for n in (0, 1, 127, 128, 300, 2**35)] == [
        b"\x00",
        b"\x01",
        b"\x7f",
        b"\x80\x01",
        b"\xac\x02",
        b"\x80\x80\x80\x80\x80\x01",
    ]


def test_struct_bytes():
    assert thrift.encode([(1, 5, 1)]) == bytes([0x15, 0x02, 0x00])
    assert thrift.encode([(20, 5, 5)]) == bytes([0x05, 0x28, 0x0A, 0x00])
    assert thrift.encode([(1, 1, True), (2, 1, False)]) == bytes([0x11, 0x12, 0x00])
    assert thrift.encode([(1, 9, (5, [1, 2, 3]))]) == bytes([0x19, 0x35, 0x02, 0x04, 0x06, 0x00])
    assert thrift.encode([(3, 6, -1), (4, 8, "ab")]) == bytes([0x36, 0x01, 0x18, 0x02, 0x61, 0x62, 0x00])
    assert thrift.encode([(1, 12, [(2, 5, 0)]), (5, 5, None)]) == bytes([0x1C, 0x25, 0x00, 0x00, 0x00])
    assert thrift.encode([(1, 9, (5, list(range(15))))])[:3] == bytes([0x19, 0xF5, 0x0F])
