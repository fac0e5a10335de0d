"""What a kill cycle of the S3 crash harness costs (:mod:`tests.crash_harness` with ``--bucket``), and where.

Starts a local ``moto_server`` and runs the harness for each command with ``--kills K`` into a fresh bucket, as
``tests/test_crash_kills.py`` does. Prints, per command: the wall seconds, the CPU seconds of the harness and its
children and of the moto server, and the seconds per kill cycle (and the harness's progress every 10 kills). With ``--counted`` the harness talks to the
server through the counting proxy of the tests (:class:`tests.faulty_proxy.FaultyProxy`, no faults), which
opens one connection per request, and marks each phase of a cycle (:data:`tests.crash_harness.MARK`): the
requests of each phase by method (LIST is a GET of a bucket listing), the server's CPU seconds and the wall
seconds spent in it, and per cycle the server's CPU milliseconds per request (does a request cost more as the
bucket fills?). The last line is JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from tests.faulty_proxy import Fault, FaultyProxy  # noqa: E402

COMMANDS = ("ingest", "rewards", "check", "shards")
PHASE = "/__phase__/"
TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system, all threads) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class MarkingProxy(FaultyProxy):
    """The counting proxy, noting at each phase mark how many requests came before it, the server's CPU seconds
    and the time."""

    def __init__(self, upstream: str, server_pid: int) -> None:
        super().__init__(upstream)
        self.server_pid = server_pid
        self.marks: list[tuple[str, int, float, float]] = []

    def _pick(self, method: str, path: str, line: str) -> Fault | None:
        if path.startswith(PHASE):
            with self._mutex:
                now = (path[len(PHASE) :], len(self.requests), process_cpu(self.server_pid), time.perf_counter())
                self.marks.append(now)
            return None
        return super()._pick(method, path, line)


def kind(line: str) -> str:
    method, target = line.split(" ")[:2]
    return "LIST" if method == "GET" and "list-type" in urllib.parse.urlsplit(target).query else method


def phases(proxy: MarkingProxy, end: tuple[int, float, float]) -> tuple[dict[str, dict[str, Any]], list[float]]:
    """Requests by kind, server CPU and wall seconds of each phase; the server's CPU ms per request of each cycle
    (from one ``killed-setup`` mark to the next)."""
    by_phase: dict[str, Counter[str]] = defaultdict(Counter)
    marks = [*proxy.marks, ("end", *end)]
    cycles: list[list[float]] = []
    for (name, first, cpu, t), (_, last, cpu2, t2) in itertools.pairwise(marks):
        counts = by_phase[name]
        counts.update(kind(line) for line in proxy.requests[first:last])
        counts["requests"] += last - first
        counts["server_cpu_ms"] += round(1000 * (cpu2 - cpu))
        counts["wall_ms"] += round(1000 * (t2 - t))
        counts["times"] += 1
        if name == "killed-setup":
            cycles.append([0, 0.0])
        if cycles:
            cycles[-1][0] += last - first
            cycles[-1][1] += cpu2 - cpu
    per_request = [round(1000 * cpu / n, 2) for n, cpu in cycles if n]
    return {name: dict(counts) for name, counts in by_phase.items()}, per_request


def run_command(
    command: str, kills: int, seed: int, endpoint: str, pid: int, work: Path, counted: bool, dump: Path | None
) -> dict:
    from tests.s3_server import client_for, environ_for

    bucket = f"prl-kills-{command}-{'counted' if counted else 'direct'}"
    client = client_for(endpoint)
    client.create_bucket(Bucket=bucket)
    root = work / bucket
    root.mkdir(parents=True)
    with MarkingProxy(endpoint, pid) as proxy:
        env = {k: v for k, v in environ_for(proxy.url if counted else endpoint).items()}
        env.pop("PRL_LOCK_STALE_AFTER", None)
        env |= {"TMPDIR": str(root), "TOKENIZERS_PARALLELISM": "false", "POLARS_MAX_THREADS": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
        if counted:
            env["PRL_CRASH_MARK"] = proxy.url
        argv = [sys.executable, "-m", "tests.crash_harness", command, str(root), "--kills", str(kills)]
        argv += ["--seed", str(seed + COMMANDS.index(command)), "--bucket", bucket]
        cpu0, server0, t0 = children_cpu(), process_cpu(pid), time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
        end = (len(proxy.requests), process_cpu(pid), time.perf_counter())
        wall, harness, server = end[2] - t0, children_cpu() - cpu0, end[1] - server0
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or not summary:
        raise SystemExit(f"{command} failed: {summary.get('error') or proc.stderr[-4000:]}")
    progress = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith('{"killed"')]
    result = {
        "progress": [[step["killed"], step["cycles"], step["seconds"]] for step in progress],
        "wall_s": round(wall, 1),
        "harness_cpu_s": round(harness, 1),
        "server_cpu_s": round(server, 1),
        "cycles": summary["cycles"],
        "wall_per_cycle_s": round(wall / summary["cycles"], 2),
        "summary": summary,
    }
    if counted:
        if dump is not None:  # the request lines, each phase's headed by its mark
            starts = {first: name for name, first, _, _ in proxy.marks}
            lines = [f"## {starts[i]}\n{line}" if i in starts else line for i, line in enumerate(proxy.requests)]
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"{command}.txt").write_text("\n".join(lines) + "\n")
        result["requests"] = len(proxy.requests) - len(proxy.marks)
        result["phases"], result["server_ms_per_request_by_cycle"] = phases(proxy, end)
    return result


SHOWN = ("requests", "GET", "LIST", "PUT", "HEAD", "DELETE", "POST", "server_cpu_ms", "wall_ms", "times")


def show(command: str, result: dict) -> None:
    print(
        f"{command:<8} wall {result['wall_s']:>6} s  harness CPU {result['harness_cpu_s']:>6} s  "
        f"server CPU {result['server_cpu_s']:>6} s  {result['cycles']} cycles, {result['wall_per_cycle_s']} s each"
        + (f", {result['requests']} requests" if "requests" in result else "")
    )
    if result["progress"]:
        print(f"    [kills, cycles, seconds] every 10 kills: {result['progress']}")
    if "phases" not in result:
        return
    print(f"    {'phase':<14}" + "".join(f"{k.split('_')[0][:7]:>9}" for k in SHOWN))
    for name, counts in result["phases"].items():
        print(f"    {name:<14}" + "".join(f"{counts.get(k, 0):>9}" for k in SHOWN))
    print(f"    server CPU ms per request, by cycle: {result['server_ms_per_request_by_cycle']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--commands", nargs="*", default=list(COMMANDS), choices=COMMANDS)
    parser.add_argument("--counted", action="store_true", help="through the counting proxy, by phase")
    parser.add_argument("--dump", type=Path, help="with --counted: write each command's request lines here")
    args = parser.parse_args()

    from tests.s3_server import moto_process

    results: dict[str, dict] = {}
    with moto_process() as (endpoint, proc), tempfile.TemporaryDirectory(prefix="prl-bench-kills-") as tmp:
        for command in args.commands:
            results[command] = run_command(
                command, args.kills, args.seed, endpoint, proc.pid, Path(tmp), args.counted, args.dump
            )
            show(command, results[command])
    print(json.dumps({"kills": args.kills, "counted": args.counted, "results": results}))


if __name__ == "__main__":
    main()
