"""Steps run as engine tasks: no step asks which engine it runs on.

A step cuts its work into ``engine.width(...)`` tasks and folds what ``engine.map`` hands back. These tests drive
ingest, check-tokens and build-shards on an engine that cuts the work into up to seven tasks and hands them back
in reverse order (in this process, so they run in every ``make test``; the Ray cluster's own tests are in
``make test-all``), and check what the local engine's one in-process task borrows from the driver: the tokenizer
it loaded, the sample index and the progress meter, each given back when the run ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prl.checks import check_tokens
from prl.checks import remote as check_tasks
from prl.checks.tokenizer import CheckTokenizer
from prl.errors import UsageError
from prl.ingestion import remote as ingest_tasks
from prl.ingestion.traces import ingest
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.store.changes import snapshot_files
from prl.store.tables import Store
from tests.checks_helpers import EOS, TRACES_SCHEMA_TABLE, tokenizer_dir
from tests.engine_cases import SHARD_OPTIONS, ingest_summary, same_stores, source_folder
from tests.records import vllm_chat
from tests.shards_fixtures import varied_store
from tests.test_checks_prefix import C0, C1, NEXT_USER, P0, turn


@dataclass(frozen=True)
class Wide:
    """An engine that cuts work into up to seven tasks and hands their results back last task first."""

    name: str = "wide"

    def width(self, items: int, *, threads: int = 1) -> int:
        return min(items, 7)

    def map(
        self, fn: Callable[[Any], Iterable[Any]], tasks: Sequence[Any], *, gpu: bool = False, threads: int = 1
    ) -> Iterator[Any]:
        for task in reversed(list(tasks)):
            yield from list(fn(task))


def _store(path: str) -> Store:
    """Four commits (four files) of 30 conversations of two turns, every third with a first turn that the second
    realigns to, and 30 later turns whose session holds no turn before them."""
    store = Store(path)
    for c in range(4):
        rows = []
        for s in range(30):
            sid = f"c{c}s{s}"
            rows.append(turn(sid + "t1", sid, 1, P0 + C0 + NEXT_USER, C1))
            rows.append(turn(sid + "t0", sid, 0, P0, C0 if s % 3 else [*C0[:-2], 5, EOS]))
            rows.append(turn(sid + "t2x", sid + "u", 2, P0 + C0 + NEXT_USER, C1))
        store.commit("traces", TRACES_SCHEMA_TABLE(rows).to_batches())
    return store


def _summary(result: Any) -> dict[str, Any]:
    out = dict(result.to_json())
    for key in ("elapsed_s", "store", "checks_version", "tokens_roundtripped"):  # the last: each task caches apart
        out.pop(key, None)
    return out


@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_check_tokens_cut_into_many_tasks_commits_what_one_task_commits(tmp_path, rate):
    one, many = _store(str(tmp_path / "one")), _store(str(tmp_path / "many"))
    a = check_tokens(one, tokenizer_dir(), batch_size=16, sample_rate=rate)
    b = check_tokens(many, tokenizer_dir(), batch_size=16, sample_rate=rate, engine=Wide())
    if rate == 1.0:
        assert a.verdicts == {"ok": 320, "note": 40, "warn": 0, "drift": 0, "invalid": 0}
        assert a.prefix == {"CLEAN": 80, "REALIGN": 40, "FORK": 0}
    else:
        assert 0 < a.checked + a.sampled_out == 360 and a.sampled_out > 0
    assert _summary(a) == _summary(b)
    columns = [c for c in one.read("checks").schema.names if c != "checked_at"]
    rows_a = one.read("checks").select(columns).sort_by("sample_id")
    rows_b = many.read("checks").select(columns).sort_by("sample_id")
    assert rows_a.num_rows == a.checked and rows_a.equals(rows_b)


def test_the_local_engine_checks_with_the_tokenizer_the_driver_loaded(tmp_path, monkeypatch):
    store = _store(str(tmp_path / "s"))
    loads: list[str] = []
    load = CheckTokenizer.load.__func__  # type: ignore[attr-defined]

    def counted(cls: type[CheckTokenizer], path: str, *args: Any, **kwargs: Any) -> CheckTokenizer:
        loads.append(path)
        return load(cls, path, *args, **kwargs)

    monkeypatch.setattr(CheckTokenizer, "load", classmethod(counted))
    result = check_tokens(store, tokenizer_dir(), batch_size=16)
    assert result.checked == 360 and loads == [tokenizer_dir()]
    assert check_tasks._TOKENIZERS == {}  # given back when the run ends


def test_a_mismatched_tokenizer_stops_the_run_before_anything_is_written(tmp_path):
    store = Store(str(tmp_path / "s"))
    rows = [turn(f"x{i}", None, 0, [200_000 + i, 200_001], [200_002, EOS]) for i in range(8)]
    store.commit("traces", TRACES_SCHEMA_TABLE(rows).to_batches())
    for engine in (None, Wide()):
        with pytest.raises(UsageError, match="does not match the data: 8 of 8 samples"):
            check_tokens(store, tokenizer_dir(), engine=engine)
        assert store.open("checks") is None


def test_the_local_engine_reads_with_the_drivers_index_and_progress(tmp_path):
    paths, size = [], 0
    for f in range(3):
        path = tmp_path / f"t{f}.jsonl"
        with open(path, "w") as fh:
            for i in range(5):
                record = vllm_chat(f"c{f}-{i}", [0, 128803, 19923, 128804], [([12, 1], [-0.25, -0.0625])])
                fh.write(json.dumps(record) + "\n")
        paths.append(str(path))
        size += path.stat().st_size
    for dry_run in (True, False):
        seen: list[int] = []
        result = ingest(paths, str(tmp_path / "store"), progress=seen.append, dry_run=dry_run)
        assert (result.samples, sum(seen), result.bytes_read) == (15, size, size)
        assert ingest_tasks._SERVED == {}  # given back when the run ends
    assert result.versions["traces"] == 1


def test_ingest_cut_into_units_handed_back_in_reverse_commits_what_one_unit_commits(tmp_path):
    folder = source_folder(tmp_path / "in")  # the last file repeats a sample of the first: its unit is read again
    one, many = Store(str(tmp_path / "one")), Store(str(tmp_path / "many"))
    first = ingest([str(folder)], one)
    seen: list[int] = []
    wide = ingest([str(folder)], many, engine=Wide(), progress=seen.append)
    assert (first.samples, first.already_present, first.quarantined) == (
        13,
        2,
        {"malformed_json": 1, "no_token_ids": 1, "duplicate_sample_id": 2},
    )
    assert ingest_summary(wide) == ingest_summary(first)
    same_stores(one, many)
    assert (len(snapshot_files(one, "traces", 1)), len(snapshot_files(many, "traces", 1))) == (1, 4)
    assert sum(seen) == wide.bytes_read  # the unit read again is counted once


def test_build_shards_cut_into_tasks_handed_back_in_reverse_writes_the_same_bytes(tmp_path):
    store = varied_store(str(tmp_path / "store"))
    options = ShardOptions.from_mapping(SHARD_OPTIONS)
    local = build_shards(store, str(tmp_path / "local"), options=options)
    wide = build_shards(store, str(tmp_path / "wide"), options=options, engine=Wide())
    assert (local.status, local.rows, len(local.shards)) == ("built", 56, 16)
    assert (wide.set_id, wide.shards) == (local.set_id, local.shards)  # names, rows, tokens, sha256 of each part
    manifests = [json.loads(Path(r.manifest_path).read_text()) for r in (local, wide)]
    assert manifests[0] == manifests[1]  # statistics and KL sums too
