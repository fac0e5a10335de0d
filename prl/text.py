"""Words for people: counts with their nouns."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 set``, ``2 sets``, ``1,024 files``: ``n`` with thousands separators and ``noun`` (``plural``, default
    ``noun + "s"``, unless ``n`` is 1)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


__all__ = ["counted"]
