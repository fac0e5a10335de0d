"""Helpers for the wire-format tests: read a fixture through a format's framing and parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prl.formats import registry
from prl.formats.base import Format, ParseOptions, Quarantined, Sample

FIXTURES = Path(__file__).parent / "fixtures"

P1 = [0, 128803, 3085, 344, 223, 20, 13, 20, 33, 128804]
"""``<bos><User>What is 2+2?<Assistant>`` in the DeepSeek-V4 tokenizer."""
C1 = [671, 3287, 344, 223, 22, 16, 1]
"""``The answer is 4.<eos>``"""
L1 = [-0.5, -0.25, -0.125, -1.5, -0.0625, -2.0, -0.75]
P2 = [0, 128803, 59201, 294, 8760, 33, 128804]
"""``<bos><User>Capital of France?<Assistant>``"""
C2 = [51119, 1]
"""``Paris<eos>``"""


def lines_of(path: Path) -> list[tuple[int, bytes]]:
    return list(enumerate(path.read_bytes().splitlines(), start=1))


def parse_file(name: str, fixture: str, options: ParseOptions | None = None) -> list[tuple[int, Any]]:
    """``(line, Sample | Quarantined)`` for every record of a fixture, as ingest would see them."""
    fmt = registry.by_name(name)
    options = options or ParseOptions()
    out: list[tuple[int, Any]] = []
    for record in fmt.frame(iter(lines_of(FIXTURES / fixture))):
        if record.error is not None:
            out.append((record.line, record.error))
            continue
        try:
            out.extend((record.line, item) for item in fmt.parse(record.obj, options))
        except Quarantined as q:
            out.append((record.line, q))
    return out


def samples(items: list[tuple[int, Any]]) -> list[Sample]:
    return [s for _, s in items if isinstance(s, Sample)]


def reasons(items: list[tuple[int, Any]]) -> list[tuple[int, str]]:
    return [(line, q.reason) for line, q in items if isinstance(q, Quarantined)]


def parse_one(fmt: Format, obj: Any) -> list[Sample | Quarantined]:
    """Parse, turning a record-level raise into a one-element list."""
    try:
        return fmt.parse(obj, ParseOptions())
    except Quarantined as q:
        return [q]


def reason_of(fmt: Format, obj: Any) -> str | None:
    """The first quarantine reason of a record, from parsing or from ingest's validation (None when clean)."""
    from prl.ingestion.assemble import validate

    for item in parse_one(fmt, obj):
        if isinstance(item, Quarantined):
            return item.reason
        try:
            validate(item)
        except Quarantined as q:
            return q.reason
    return None


def heads(sample: Sample) -> tuple[Any, Any]:
    if sample.topk_ids is None:
        return None, None
    return sample.topk_ids.to_pylist(), sample.topk_logprobs.to_pylist()


def json_paths(obj: Any, prefix: tuple = (), width: int = 4) -> list[tuple]:
    """Paths (key / index tuples) to every value of a decoded JSON document, the first ``width`` items of
    each list included: the places a fuzz test may mutate."""
    out = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.extend(json_paths(value, (*prefix, key), width))
    elif isinstance(obj, list):
        for i, value in enumerate(obj[:width]):
            out.extend(json_paths(value, (*prefix, i), width))
    return out


def mutate(obj: Any, path: tuple, value: Any, delete: bool) -> Any:
    """``obj`` with the value at ``path`` (from :func:`json_paths`) set to ``value`` or deleted, in place; the
    empty path gives ``value`` itself (a record that is not an object)."""
    if not path:
        return value
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj
