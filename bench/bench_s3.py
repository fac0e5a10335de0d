"""Ingest from S3 against ingest from local disk, the same file in the same run.

Generates a vLLM chat-completions JSONL of ``--mb`` megabytes (``gen_data.make_vllm_chat_file``), uploads it to a
local ``moto_server`` (a real S3 API in its own process), then ingests it, each run in a fresh process so its peak
RSS is its own:

1. local file → local store (the baseline);
2. ``s3://`` object → local store (S3 source reads: listing, buffered ranged GETs);
3. ``s3://`` object → ``s3://`` store (also the Parquet upload, Delta commit and lock on S3);
4. the same again, which finds nothing new: the fixed per-run cost of an S3 store (lock, Delta log reads).

Each case runs ``--repeats`` times, interleaved, and the fastest counts. Prints tokens/s, peak RSS and the ratio S3 / local (target ≥ 0.7 for S3 sources).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from bench_ingest import prl_ingest_code  # noqa: E402


def _child(code: str, env: dict[str, str]) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line; peak RSS is added from getrusage."""
    wrapper = (
        "import json, resource, time\n"
        f"{code}\n"
        "out['peak_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", wrapper], capture_output=True, text=True, check=True, env=env, cwd=ROOT
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ingest(source: str, store: str, env: dict[str, str]) -> dict:
    return _child(prl_ingest_code(source, store), env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=int(os.environ.get("PRL_BENCH_S3_MB", "50")))
    parser.add_argument("--repeats", type=int, default=2, help="runs of each case; the fastest counts")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    import boto3
    from gen_data import make_vllm_chat_file

    from tests.s3_server import CREDENTIALS, moto_server

    work = args.workdir or tempfile.mkdtemp(prefix="prl-bench-s3-")
    path = os.path.join(work, "vllm_chat.jsonl")
    stats = make_vllm_chat_file(path, args.mb * 1024 * 1024, topk=0, seed=0)
    size = os.path.getsize(path)
    tokens = stats["prompt_tokens"] + stats["completion_tokens"]
    print(f"input: {size / 1e6:.0f} MB, {stats['records']:,} records, {tokens:,} tokens")

    with moto_server() as endpoint:
        os.environ.update({**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint})  # a test server: test credentials
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
        client = boto3.client("s3", endpoint_url=endpoint, region_name=CREDENTIALS["AWS_REGION"])
        client.create_bucket(Bucket="prl-bench")
        client.upload_file(path, "prl-bench", "traces/vllm_chat.jsonl")

        cases = {
            "local → local store": (path, os.path.join(work, "store-local")),
            "s3    → local store": ("s3://prl-bench/traces/", os.path.join(work, "store-s3src")),
            "s3    → s3 store   ": ("s3://prl-bench/traces/", "s3://prl-bench/store"),
        }
        runs: dict[str, dict] = {}
        for attempt in range(args.repeats):  # interleaved; the fastest of each counts (a shared machine is noisy)
            for name, (source, store) in cases.items():
                run = _ingest(source, f"{store}-{attempt}", env)
                if name not in runs or run["seconds"] < runs[name]["seconds"]:
                    runs[name] = run
        rerun = _ingest("s3://prl-bench/traces/", "s3://prl-bench/store-0", env)  # nothing new: fixed cost
    assert rerun["samples"] == 0, rerun
    rates = {}
    for name, run in runs.items():
        assert run["samples"] == stats["records"] and run["tokens"] == tokens, (name, run)
        rates[name] = tokens / run["seconds"]
        print(
            f"{name}: {run['seconds']:6.2f} s  {rates[name] / 1e6:6.2f} M tokens/s  "
            f"{size / run['seconds'] / 1e6:6.1f} MB/s  peak RSS {run['peak_rss_mb']:5.0f} MB"
        )
    base = rates["local → local store"]
    ratio_src = rates["s3    → local store"] / base
    ratio_both = rates["s3    → s3 store   "] / base
    print(f"rerun with nothing new on the S3 store (per-run fixed cost): {rerun['seconds']:.2f} s")
    print(f"ratio S3 source / local: {ratio_src:.2f} (target ≥ 0.7)   S3 source + S3 store / local: {ratio_both:.2f}")
    summary = {"mb": args.mb, "ratio_s3_source": round(ratio_src, 3), "ratio_s3_store": round(ratio_both, 3)}
    print(json.dumps(summary))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"bench_s3 took {time.perf_counter() - started:.1f} s")
