"""``prl inspect``: exact store aggregates and shard histograms; unicode bars; histogram binning."""

from __future__ import annotations

import io
import os

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from prl.report import console as report
from prl.report.inspect import histogram, inspect, inspect_shards, inspect_store
from prl.schema import TRACES
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.store.tables import Store
from tests.shards_fixtures import make_store, random_store, reward, trace, verdict


def small_store(root: str) -> Store:
    traces = [
        trace("a:0", "g1", [1, 2], [3, 4, 1], source_format="openai_chat", model="m1", policy_version="step-1"),
        trace("b:0", "g1", [1, 2], [5, 1], source_format="openai_chat", model="m1", policy_version="step-2"),
        trace("c:0", "g2", [7], [8, 9, 10, 1], source_format="sglang_generate", model="m2", policy_version=None),
    ]
    rewards = [reward("a:0", 1.0), reward("b:0", 0.0), reward("c:0", 0.5), reward("a:0", 0.25, name="format")]
    checks = [
        verdict("a:0", "ok"),
        verdict("b:0", "drift", at=0) | {"reasons": ["roundtrip"]},
        verdict("b:0", "ok", at=5),  # a later verdict for the same sample and tokenizer wins
        verdict("c:0", "invalid") | {"reasons": ["vocab", "logprobs"]},
        verdict("a:0", "warn", fingerprint="tok-b") | {"reasons": ["special"]},
    ]
    store = make_store(root, traces, rewards, checks)
    store.commit("quarantine", [_quarantine_batch()])
    return store


def _quarantine_batch():
    import pyarrow as pa

    from prl.schema import QUARANTINE

    rows = [
        {
            "quarantine_id": f"q{i}",
            "table": t,
            "source_uri": "f",
            "source_line": i,
            "reason": r,
            "message": "m",
            "raw_truncated": False,
            "quarantined_at": 0,
        }
        for i, (t, r) in enumerate(
            [("traces", "length_mismatch"), ("traces", "length_mismatch"), ("rewards", "missing_key")]
        )
    ]
    return pa.RecordBatch.from_pylist(rows, schema=QUARANTINE)


def test_store_aggregates_exact(tmp_path):
    store = small_store(str(tmp_path / "s"))
    result = inspect(str(tmp_path / "s"))
    assert result.kind == "store"
    assert result.tables["traces"] == {"version": 1, "rows": 3, "files": 1, "bytes": result.tables["traces"]["bytes"]}
    assert result.tables["ref_logprobs"] == {"version": None, "rows": 0, "files": 0, "bytes": 0}
    assert (result.tables["rewards"]["rows"], result.tables["checks"]["rows"]) == (4, 5)
    assert result.traces_by["source_format"] == [
        {"value": "openai_chat", "samples": 2},
        {"value": "sglang_generate", "samples": 1},
    ]
    assert result.traces_by["policy_version"] == [
        {"value": "step-1", "samples": 1},
        {"value": "step-2", "samples": 1},
        {"value": None, "samples": 1},
    ]
    assert result.traces_by["model"] == [{"value": "m1", "samples": 2}, {"value": "m2", "samples": 1}]
    assert result.quarantine == [
        {"table": "traces", "reason": "length_mismatch", "records": 2},
        {"table": "rewards", "reason": "missing_key", "records": 1},
    ]
    assert result.checks == [
        {
            "tokenizer_fingerprint": "tok-a",
            "checked": 3,
            "verdicts": {"ok": 2, "note": 0, "warn": 0, "drift": 0, "invalid": 1},
            "drift_rate": 1 / 3,
            "warn_rate": 0.0,
            "note_rate": 0.0,
            "top_reasons": {"logprobs": 1, "vocab": 1},
        },
        {
            "tokenizer_fingerprint": "tok-b",
            "checked": 1,
            "verdicts": {"ok": 0, "note": 0, "warn": 1, "drift": 0, "invalid": 0},
            "drift_rate": 0.0,
            "warn_rate": 1.0,
            "note_rate": 0.0,
            "top_reasons": {"special": 1},
        },
    ]
    assert result.rewards == [
        {"name": "format", "events": 1, "samples": 1, "mean": 0.25, "min": 0.25, "max": 0.25},
        {"name": "reward", "events": 3, "samples": 3, "mean": 0.5, "min": 0.0, "max": 1.0},
    ]
    assert store.uri == result.uri
    console = Console(file=io.StringIO(), width=120, record=True)
    report.render_inspect(result, console)
    text = console.export_text()
    assert "quarantine by reason" in text and "traces: length_mismatch" in text and "█" in text
    assert "drift rate 33.33%" in text


def test_store_inspection_projects_a_few_scalar_columns(tmp_path, monkeypatch):
    """Every scan is pushed down to the few scalar columns it aggregates: traces scans read 1 of all of its columns."""
    import re

    small_store(str(tmp_path / "s"))
    plans: list[str] = []
    real = pl.LazyFrame.collect

    def spy(self, *args, **kwargs):
        plans.append(self.explain())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pl.LazyFrame, "collect", spy)
    inspect_store(Store(str(tmp_path / "s")))
    projections = [tuple(map(int, m)) for plan in plans for m in re.findall(r"PROJECT (\d+)/(\d+) COLUMNS", plan)]
    assert len(plans) == 3 + 2 + 2 + 1  # traces by 3 columns, quarantine (cut lines, reasons), checks (2), rewards
    assert projections.count((1, len(TRACES))) == 3  # traces: one column per aggregate, never the token lists
    assert all(n <= 4 for n, _ in projections), projections


def test_shard_histograms_match_the_shards(tmp_path):
    store = random_store(str(tmp_path / "s"), n_groups=6, group_size=3, seed=4, with_ref=True)
    options = ShardOptions(kl="column", target_tokens=40)
    built = build_shards(store, str(tmp_path / "out"), options=options)
    result = inspect(str(tmp_path / "out"))
    assert result.kind == "shards" and [s["set_id"] for s in result.sets] == [built.set_id]
    assert result.totals == {"rows": 18, "tokens": built.tokens, "shards": len(built.shards), "groups": 6}
    table = pl.concat([pl.read_parquet(os.path.join(built.set_dir, e["file"])) for e in built.shards], how="vertical")
    assert (
        result.histograms["reward"]["counts"]
        == np.histogram(table["reward"].to_numpy(), bins=[-0.5, 0.5, 1.5, 2.5])[0].tolist()
    )
    completion = (table["input_ids"].list.len() - table["prompt_len"]).to_numpy()
    assert result.histograms["completion_len"]["count"] == 18
    assert result.histograms["completion_len"]["min"] == completion.min()
    assert result.histograms["completion_len"]["max"] == completion.max()
    assert sum(result.histograms["completion_len"]["counts"]) == 18
    kl_means = table["kl"].list.mean().to_numpy()
    assert np.isclose(result.histograms["kl"]["mean"], kl_means.astype(np.float32).mean(), rtol=1e-6)
    assert result.histograms["group_size"]["edges"] == [2.5, 3.5] and result.histograms["group_size"]["counts"] == [18]
    # a single set folder gives the same numbers as its OUT folder
    assert inspect_shards(built.set_dir).histograms == result.histograms
    console = Console(file=io.StringIO(), width=120, record=True)
    report.render_inspect(result, console)
    text = console.export_text()
    assert f"{built.set_id}" in text and "advantage: n=18" in text and "kl: n=18" in text


def test_shard_inspection_reads_only_scalar_mask_and_kl_columns(tmp_path, monkeypatch):
    store = random_store(str(tmp_path / "s"), n_groups=2, group_size=2, seed=1)
    build_shards(store, str(tmp_path / "out"), options=ShardOptions())
    asked: list[list[str]] = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *args, columns=None, **kwargs):
        asked.append(list(columns))
        return real(self, *args, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    inspect(str(tmp_path / "out"))
    assert asked == [["reward", "advantage", "staleness", "prompt_len", "group_size", "loss_mask"]]


def test_histogram_bins():
    h = histogram(np.array([1, 2, 2, 3, 3, 3, np.nan]))
    assert (h["count"], h["min"], h["max"], h["integer"]) == (6, 1.0, 3.0, True)
    assert h["edges"] == [0.5, 1.5, 2.5, 3.5] and h["counts"] == [1, 2, 3]
    wide = histogram(np.arange(0, 100))
    assert wide["edges"][:3] == [-0.5, 8.5, 17.5] and wide["counts"] == [9] * 11 + [1]
    floats = histogram(np.array([0.0, 0.1, 0.6, 0.9, 1.0]), bins=4)
    assert floats["edges"] == [0.0, 0.25, 0.5, 0.75, 1.0] and floats["counts"] == [2, 0, 1, 2]
    assert histogram(np.array([0.5, 0.5]))["counts"] == [2]
    assert histogram(np.array([np.inf]))["count"] == 0
    assert (h["unknown"], histogram(np.array([np.inf, np.nan]))["unknown"], wide["unknown"]) == (1, 2, 0)


def test_a_histogram_title_counts_the_unknown_values():
    hist = histogram(np.array([0, 1, 1, 2, np.nan, np.nan, np.nan]))
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(report.histogram_table("staleness", hist))
    assert console.export_text().splitlines()[0] == "staleness: n=4 (3 unknown) min=0 p50=1 mean=1 max=2"
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(report.histogram_table("reward", histogram(np.array([0.0, 1.0]))))
    assert console.export_text().splitlines()[0].startswith("reward: n=2 min=0 p50=0.5")


def test_inspect_uses_the_whole_width_in_a_pipe_or_the_width_asked(tmp_path):
    """Piped (a cron log), the tables take the width they need: nothing is cut to 80 columns."""
    import subprocess
    import sys

    traces = [
        trace(f"s{i}:0", "g", [1] * 40, [2] * 40, source_format=f"a_rather_long_format_name_{i:03d}") for i in range(3)
    ]
    make_store(str(tmp_path / "s"), traces)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": repo}

    def shown(*extra: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "prl", "inspect", str(tmp_path / "s"), *extra],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.splitlines()

    piped = shown()
    assert max(len(line) for line in piped) > 80
    rows = [line for line in piped if "a_rather_long_format_name_" in line]
    assert len(rows) == 3 and all("…" not in line for line in rows)
    assert str(tmp_path / "s") in piped[0]
    narrow = shown("--width", "60")
    assert max(len(line) for line in narrow) <= 60
    assert report.sized(72).width == 72


@given(st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(float("nan"))), max_size=200), st.integers(1, 30))
def test_histogram_counts_every_finite_value_once(values, bins):
    h = histogram(np.array(values, dtype=np.float64), bins=bins)
    finite = [v for v in values if np.isfinite(v)]
    assert sum(h["counts"]) == len(finite) == h["count"]
    if finite:
        assert h["edges"][0] <= min(finite) and h["edges"][-1] >= max(finite)
        assert len(h["counts"]) <= max(bins, 1) and len(h["edges"]) == len(h["counts"]) + 1


def test_bar_resolution():
    assert report.bar(0, 10) == "" and report.bar(10, 10, width=4) == "████"
    assert report.bar(1, 8, width=1) == "▏" and report.bar(5, 10, width=3) == "█▌"


def test_a_truncated_line_finished_and_ingested_later_counts_once_as_its_sample(tmp_path):
    """A last line cut short in a file that stopped changing is ``truncated_line``; once its writer finishes it,
    the next ingest reads it again and its samples land. The sample wins: inspect leaves the quarantine record
    out of the quarantine counts and reports it as superseded."""
    from prl.ingestion.traces import ingest
    from prl.report.inspect import inspect
    from prl.store.tables import Store
    from tests.pipeline_helpers import GrowingInput

    data = GrowingInput(tmp_path / "in", files=1, seed=3, bad_every=1000)
    data.grow(4)
    path = next((tmp_path / "in" / "traces").iterdir())
    lines = path.read_text().splitlines(keepends=True)
    cut = lines[3]  # the fourth record (the fifth line is the growth's malformed one)
    path.write_text("".join(lines[:3]) + cut[:40])
    store = str(tmp_path / "store")
    first = ingest([str(path)], store, partial_line_grace=0, max_quarantine_rate=None)
    assert first.quarantined == {"truncated_line": 1}
    with open(path, "a") as fh:
        fh.write(cut[40:] + lines[4])
    second = ingest([str(path)], store, partial_line_grace=0, max_quarantine_rate=None)
    assert second.quarantined == {"malformed_json": 1}
    lines_landed = Store(store).read("traces", columns=["source_line"]).column("source_line").to_pylist()
    assert 4 in lines_landed and sorted(set(lines_landed)) == [1, 2, 3, 4]
    found = inspect(store)
    assert found.quarantine == [{"table": "traces", "reason": "malformed_json", "records": 1}]
    assert found.quarantine_superseded == 1
    assert found.to_json()["quarantine_superseded"] == 1
