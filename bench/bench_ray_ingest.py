"""Scale case: ingest on the local engine and on a local Ray cluster of 1 and 2 workers.

Generates ``--files`` vLLM chat-completions JSONL files of ``--mb`` megabytes each (``gen_data.py``), then, each run
in a fresh process that joins its cluster the way ``prl`` does (``RAY_ADDRESS``), ingests them into a fresh store on
``local``, ``ray`` with 1 worker and ``ray`` with 2 workers (one CPU each; the head holds no CPU, so every file is
read on a worker). Reports tokens/s per case, the per-worker efficiency of 2 workers
(``tokens/s(2) / (2 · tokens/s(1))``), and whether every store holds the same traces rows (a digest of the sorted
``sample_id``, ``record_digest`` pairs) and the same ledger. Every node here shares one small machine (and its
other users), so the numbers are indicative only.
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
import hashlib, json, sys, time
sys.path.insert(0, {root!r})
from prl.runtime import set_process_defaults
set_process_defaults()
from prl.ingestion.traces import ingest
from prl.store.tables import Store
t = time.perf_counter()
result = ingest([{sources!r}], {store!r}, engine={engine!r}, max_quarantine_rate=None)
seconds = time.perf_counter() - t
table = Store({store!r}).read("traces", columns=["sample_id", "record_digest"]).sort_by("sample_id")
rows = hashlib.sha256("\\n".join(a + " " + b for a, b in zip(*(c.to_pylist() for c in table.columns))).encode())
ledger = sorted((f.uri, f.sha256, f.samples) for f in result.files)
print(json.dumps({{"seconds": seconds, "samples": result.samples, "tokens": result.tokens,
                   "rows": rows.hexdigest(), "ledger": ledger}}))
"""


def _run(engine: str, sources: str, store: str, env: dict[str, str]) -> dict:
    code = RUN.format(root=ROOT, sources=sources, store=store, engine=engine)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})
    shutil.rmtree(store, ignore_errors=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["tokens_per_s"] = out["tokens"] / out["seconds"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4, help="trace files")
    parser.add_argument("--mb", type=int, default=16, help="megabytes per file")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Ray worker counts to run")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("ray") is None:
        print(json.dumps({"skipped": "needs the prl[ray] extra"}))
        return 0
    from gen_data import make_vllm_chat_file

    sys.path.insert(0, ROOT)
    from prl.engines.ray.cluster import LocalCluster

    tmp = tempfile.mkdtemp(prefix="prl-bench-ray-ingest-")
    try:
        sources = os.path.join(tmp, "in")
        os.makedirs(sources)
        for i in range(args.files):
            make_vllm_chat_file(os.path.join(sources, f"part-{i}.jsonl"), args.mb * 1024 * 1024, seed=i)
        report: dict = {"files": args.files, "mb_per_file": args.mb, "cpus": os.cpu_count(), "shared_machine": True}
        report["local"] = _run("local", sources, os.path.join(tmp, "local"), {})
        for workers in args.workers:
            t = time.perf_counter()
            with LocalCluster(workers=workers, cpus=1, head_cpus=0, object_store_mb=256) as cluster:
                started = time.perf_counter() - t
                case = _run("ray", sources, os.path.join(tmp, f"ray{workers}"), cluster.env)
            report[f"ray_{workers}_workers"] = {**case, "cluster_start_s": started}
        cases = [c for c in report.values() if isinstance(c, dict)]
        report["identical_rows_and_ledger"] = len({(c["rows"], json.dumps(c.pop("ledger"))) for c in cases}) == 1
        one, two = report.get("ray_1_workers"), report.get("ray_2_workers")
        if one and two:
            report["per_worker_efficiency"] = two["tokens_per_s"] / (2 * one["tokens_per_s"])
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
