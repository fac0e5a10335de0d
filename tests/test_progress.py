"""Progress of long work: the counts a task keeps, the log lines a cron run gets, the bar a terminal gets, and a
whole ingest, check-tokens and build-shards reporting through them."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from prl import progress
from prl.progress import LogSink, Task
from prl.report.progress import BarSink, for_console

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "sample_data")


class Recorder:
    """A sink that keeps every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, int]]] = []

    def start(self, task: Task) -> None:
        self.calls.append(("start", task.done, dict(task.counts)))

    def update(self, task: Task) -> None:
        self.calls.append(("update", task.done, dict(task.counts)))

    def stop(self, task: Task) -> None:
        self.calls.append(("stop", task.done, dict(task.counts)))


def test_a_task_counts_its_unit_and_its_side_counts():
    task = Task("ingest", 2_000_000, "bytes", {"files": 4}, None)
    task.advance(1_500_000)
    task.advance(250_000, files=1)
    task.advance(files=2)
    assert (task.done, task.counts, task.totals) == (1_750_000, {"files": 3}, {"files": 4})
    task.grow(1_000_000, files=1)
    assert (task.total, task.totals) == (3_000_000, {"files": 5})


def test_the_line_gives_amount_share_side_counts_rate_and_eta():
    task = Task("check-tokens", 100, "samples", {}, None)
    task.started = 0.0
    task.advance(25)
    assert task.line(now=10.0) == "check-tokens: 25 of 100 samples (25%), 2.5 samples/s, ETA 0:00:30"
    task = Task("ingest", 720_000_000, "bytes", {"files": 13}, None)
    task.started = 0.0
    task.advance(312_000_000, files=5)
    assert task.line(now=12.0) == ("ingest: 312.0 MB of 720.0 MB (43%), files 5 of 13, 26.0 MB/s, ETA 0:00:16")
    task = Task("build-shards", None, "shards", {"turn": None}, None)
    task.started = 0.0
    task.advance(turn=1)
    task.grow(3_600)
    task.advance(1_200)
    assert task.line(now=3_600.0) == "build-shards: 1,200 of 3,600 shards (33%), turn 1, 0.3 shards/s, ETA 2:00:00"
    open_ended = Task("score-ref", None, "samples", {}, None)
    open_ended.started = 0.0
    open_ended.advance(4_000)
    assert open_ended.line(now=65.0) == "score-ref: 4,000 samples, 61.5 samples/s, 0:01:05 elapsed"


def test_without_a_sink_a_task_only_counts_and_calls_back():
    seen: list[int] = []
    with progress.task("ingest", 10, "bytes", on_advance=seen.append, files=2) as task:
        task.advance(4)
        task.advance(0, files=1)
        task.advance(6, files=1)
    assert (task.done, task.counts, seen) == (10, {"files": 2}, [4, 6])


def test_reporting_sends_every_task_of_the_block_to_the_sink():
    sink = Recorder()
    with progress.reporting(sink), progress.task("check-tokens", 3, "samples") as task:
        task.advance(2)
        task.advance(1)
    with progress.task("after", 1) as other:  # outside the block: no sink
        other.advance(1)
    assert sink.calls == [("start", 0, {}), ("update", 2, {}), ("update", 3, {}), ("stop", 3, {})]


def test_log_sink_logs_once_per_interval_and_once_at_the_end(caplog):
    times = iter([4.0, 10.0, 12.0, 21.0, 30.0])  # four advances, then the end
    sink = LogSink(10.0, logging.getLogger("prl.progress.test"), clock=lambda: next(times), heartbeat=False)
    task = Task("check-tokens", 100, "samples", {}, sink)
    task.started = 0.0
    with caplog.at_level(logging.INFO, logger="prl.progress.test"):
        sink.start(task)
        for n in (10, 30, 20, 20):  # at 4 s (not due), 10 s (due), 12 s (not due), 21 s (due at 20 s)
            task.advance(n)
        sink.stop(task)
    assert [r.getMessage() for r in caplog.records] == [
        "check-tokens: 40 of 100 samples (40%), 4.0 samples/s, ETA 0:00:15",
        "check-tokens: 80 of 100 samples (80%), 3.8 samples/s, ETA 0:00:05",
        "check-tokens: 80 of 100 samples (80%), 2.7 samples/s, ETA 0:00:08, done in 0:00:30",
    ]


def test_the_heartbeat_logs_while_no_batch_ends(caplog):
    """A first batch that takes long (a tokenizer, a model loading) is not silent: the heartbeat logs on time."""
    import threading

    sink = LogSink(seconds=0.05, logger=logging.getLogger("prl.progress.beat"))
    logged = threading.Event()
    handler = logging.Handler()
    handler.emit = lambda record: logged.set()  # type: ignore[method-assign]
    logging.getLogger("prl.progress.beat").addHandler(handler)
    try:
        quiet = caplog.at_level(logging.INFO, logger="prl.progress.beat")
        with quiet, progress.reporting(sink), progress.task("score-ref", 8, "samples"):
            assert logged.wait(30)  # no advance at all
    finally:
        logging.getLogger("prl.progress.beat").removeHandler(handler)
    lines = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"score-ref: 0 of 8 samples \(0%\), 0\.0 samples/s, 0:00:\d\d elapsed", lines[0])
    assert re.fullmatch(
        r"score-ref: 0 of 8 samples \(0%\), 0\.0 samples/s, 0:00:\d\d elapsed, done in 0:00:\d\d", lines[-1]
    )
    assert sink._beats == {}  # the heartbeat ended with the task


def test_a_short_task_logs_nothing(caplog):
    sink = LogSink(seconds=10.0, logger=logging.getLogger("prl.progress.short"))
    quiet = caplog.at_level(logging.INFO, logger="prl.progress.short")
    with quiet, progress.reporting(sink), progress.task("ingest", 10, "bytes") as task:
        task.advance(10)
    assert caplog.records == []


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_ENV, "0.25")
    assert progress.interval() == 0.25
    for bad in ("", "soon", "0", "-3"):
        monkeypatch.setenv(progress.INTERVAL_ENV, bad)
        assert progress.interval() == 10.0


def test_for_console_is_a_bar_on_a_terminal_and_log_lines_elsewhere():
    assert isinstance(for_console(Console(file=io.StringIO(), force_terminal=True)), BarSink)
    assert isinstance(for_console(Console(file=io.StringIO(), force_terminal=False)), LogSink)


def test_the_bar_renders_on_a_forced_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140, color_system=None)
    with progress.reporting(BarSink(console)), progress.task("ingest", 4_000_000, "bytes", files=13) as task:
        task.advance(1_000_000, files=3)
        task.advance(1_000_000, files=2)
    text = out.getvalue()
    assert "ingest" in text
    assert "2.0 MB of 4.0 MB" in text
    assert "files 5/13" in text
    rates = re.findall(r"([\d.,]+) ([kMGT]?)B/s", text)  # the unit follows the rate the clock gave: kB/s to GB/s
    assert rates[0] == ("0", "") and any(float(n.replace(",", "")) > 0 for n, _ in rates[1:]), rates


def _prl(args: list[str], tmp_path, interval: str = "0.000001") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": REPO, progress.INTERVAL_ENV: interval}
    env.pop("COLUMNS", None)
    return subprocess.run(
        [sys.executable, "-m", "prl", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def _progress_lines(stderr: str, label: str) -> list[str]:
    return [line for line in stderr.splitlines() if f"INFO prl.progress: {label}: " in line]


@pytest.mark.slow
def test_a_cron_run_logs_progress_lines_and_keeps_json_on_stdout(tmp_path, tokenizer_dir):
    """stderr is a pipe here (as under cron): each stage logs lines with its counts, rate and ETA; stdout holds
    only the one JSON object."""
    store = str(tmp_path / "store")
    traces = os.path.join(DATA, "traces")
    ingest = _prl(["ingest", traces, "--store", store, "--finish-reason", "stop", "--json"], tmp_path)
    assert ingest.returncode == 0, ingest.stderr
    assert json.loads(ingest.stdout)["samples"] == 118
    lines = _progress_lines(ingest.stderr, "ingest")
    total = sum(os.path.getsize(os.path.join(traces, name)) for name in os.listdir(traces))
    assert lines, ingest.stderr
    size = f"{total / 1e6:.1f} MB"  # every byte of the 13 files read
    assert re.fullmatch(
        rf".* INFO prl\.progress: ingest: {size} of {size} \(100%\), files 13 of 13, [\d.,]+ [kM]B/s, ETA 0:00:00, "
        r"done in 0:00:\d\d",
        lines[-1],
    ), lines[-1]

    check = _prl(["check-tokens", "--store", store, "--tokenizer", tokenizer_dir, "--json"], tmp_path)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["checked"] == 118
    lines = _progress_lines(check.stderr, "check-tokens")
    assert lines and "118 of 118 samples (100%)" in lines[-1], check.stderr
    assert all(re.search(r"[\d.]+ samples/s, (ETA|[\d:]+ elapsed)", line) for line in lines)


def test_no_progress_lines_when_the_work_is_shorter_than_the_interval(tmp_path):
    store = str(tmp_path / "store")
    done = _prl(
        ["ingest", os.path.join(DATA, "traces", "tgi_generate.jsonl"), "--store", store, "--json"], tmp_path, "600"
    )
    assert done.returncode == 0, done.stderr
    assert _progress_lines(done.stderr, "ingest") == []
    assert json.loads(done.stdout)["command"] == "ingest"


class Counts(Recorder):
    """The tasks seen, by label: (total, done, side counts, side totals) when each ended, in order; and how many
    updates each label got."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: dict[str, list[tuple[int | None, int, dict[str, int], dict[str, int | None]]]] = {}
        self.updates: dict[str, int] = {}

    def update(self, task: Task) -> None:
        self.updates[task.label] = self.updates.get(task.label, 0) + 1

    def stop(self, task: Task) -> None:
        self.ended.setdefault(task.label, []).append((task.total, task.done, dict(task.counts), dict(task.totals)))


def test_build_shards_counts_turns_and_shards(tmp_path):
    from prl.shards.build import build_shards
    from prl.shards.options import ShardOptions
    from prl.store.tables import Store
    from tests.shards_fixtures import commit_traces, grouped_rows

    store = Store(str(tmp_path / "s"))
    for i in range(4):
        commit_traces(store, grouped_rows(f"c{i}", 2, 2), refs=False)
    sink = Counts()
    options = ShardOptions.from_mapping({"max_set_samples": "4", "target_tokens": "10"})
    with progress.reporting(sink):
        result = build_shards(store, str(tmp_path / "o"), options=options)
    shards = sum(s["shards"] for s in result.sets)
    assert (len(result.sets), shards) == (4, 8)
    assert sink.ended["build-shards"] == [(8, 8, {"turn": 4}, {"turn": None})]


def test_score_ref_counts_the_samples_it_scores(tmp_path):
    from prl.score.run import score_ref
    from tests.score_helpers import Reference, build_tiny_model, score_server, traces_store

    store, samples = traces_store(tmp_path, 12)
    ref = Reference(build_tiny_model(tmp_path / "model"))
    sink = Counts()
    with score_server(ref) as (url, _), progress.reporting(sink):
        result = score_ref(store, "tiny", endpoint=url, batch_tokens=64)
        again = score_ref(store, "tiny", endpoint=url, batch_tokens=64)
    assert (result.scored, again.scored, len(samples)) == (20, 0, 20)  # 12 records of 1 or 2 choices
    assert result.batches > 1
    # the first run: every missing sample, counted as its batches commit; the second: nothing missing
    assert sink.ended["score-ref"] == [(20, 20, {}, {}), (0, 0, {}, {})]
    assert sink.updates["score-ref"] == 2 + result.batches  # each run sets its total once; one more per batch
