"""Ingest throughput and peak memory against the raw parse limit measured in the same run.

Generates a vLLM chat-completions JSONL (≈2,000 prompt + ≈1,000 completion tokens per record, ``"token_id:N"``
logprob tokens) of ``--mb`` megabytes, then, each in its own process so peak RSS is its own:

1. ``polars.read_ndjson`` of the whole file (the raw parse limit);
2. ``prl ingest`` of the same file into a fresh store.

Each runs three times (``PRL_BENCH_ROUNDS``), alternating with the other. Prints tokens/s, MB/s and peak RSS of
the fastest runs, and the ratio ingest / raw parse of those (target ≥ 0.8, peak RSS < 1 GB) with the range over
rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _child(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line; peak RSS is added from getrusage."""
    wrapper = (
        "import json, resource, time\n"
        f"{code}\n"
        "out['peak_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


ROUNDS = int(os.environ.get("PRL_BENCH_ROUNDS", "3"))
AS_THE_COMMAND = "from prl.runtime import set_process_defaults\nset_process_defaults()\n"
"""First lines of every prl run: the allocator setting the ``prl`` command makes before pyarrow loads."""


def prl_ingest_code(source: str, store: str) -> str:
    """Code for :func:`_child` that ingests ``source`` into ``store`` as the ``prl`` command would, timed."""
    return (
        AS_THE_COMMAND + "from prl.ingestion.traces import ingest\n"
        "t = time.perf_counter()\n"
        f"r = ingest([{source!r}], {store!r})\n"
        "out = {'seconds': time.perf_counter() - t, 'samples': r.samples, 'tokens': r.tokens, 'q': r.quarantined}\n"
    )


"""Runs of each side: a busy 2-core machine slows single runs by up to 1.5x, unevenly."""


def interleaved(raw_code: str, prl_code: Callable[[int], str], rounds: int = ROUNDS) -> tuple[dict, dict, list[float]]:
    """Run the raw limit and prl ``rounds`` times each, alternating, each run in a fresh process
    (``prl_code(i)`` is round i's code, so that each round can write a store of its own).

    Returns the fastest run of each (with the largest peak RSS seen) and each round's ratio of raw time to prl
    time. Alternating exposes both sides to the same moments of a busy machine; the fastest runs are the
    least disturbed ones."""
    raws, prls = [], []
    for i in range(rounds):
        raws.append(_child(raw_code))
        prls.append(_child(prl_code(i)))
    ratios = [r["seconds"] / p["seconds"] for r, p in zip(raws, prls)]

    def best(runs: list[dict]) -> dict:
        return min(runs, key=lambda r: r["seconds"]) | {"peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}

    return best(raws), best(prls), ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=int(os.environ.get("PRL_BENCH_MB", "200")))
    parser.add_argument("--topk", type=int, default=0)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    from gen_data import make_vllm_chat_file

    work = args.workdir or tempfile.mkdtemp(prefix="prl-bench-ingest-")
    path = os.path.join(work, "vllm_chat.jsonl")
    started = time.perf_counter()
    stats = make_vllm_chat_file(path, args.mb * 1024 * 1024, topk=args.topk, seed=0)
    size = os.path.getsize(path)
    tokens = stats["prompt_tokens"] + stats["completion_tokens"]
    print(
        f"input: {size / 1e6:.0f} MB, {stats['records']:,} records, {tokens:,} tokens "
        f"(generated in {time.perf_counter() - started:.1f}s)"
    )

    raw, ing, ratios = interleaved(
        "import polars as pl\n"
        "t = time.perf_counter()\n"
        f"df = pl.read_ndjson({path!r})\n"
        "out = {'seconds': time.perf_counter() - t, 'rows': df.height}\n",
        lambda i: prl_ingest_code(path, os.path.join(work, f"store-{i}")),
    )
    assert ing["samples"] == stats["records"], ing
    raw_rate = tokens / raw["seconds"]
    ing_rate = tokens / ing["seconds"]
    print(
        f"polars.read_ndjson : {raw['seconds']:7.2f} s  {raw_rate / 1e6:7.2f} M tokens/s  "
        f"{size / raw['seconds'] / 1e6:7.1f} MB/s  peak RSS {raw['peak_rss_mb']:7.0f} MB"
    )
    print(
        f"prl ingest         : {ing['seconds']:7.2f} s  {ing_rate / 1e6:7.2f} M tokens/s  "
        f"{size / ing['seconds'] / 1e6:7.1f} MB/s  peak RSS {ing['peak_rss_mb']:7.0f} MB"
    )
    print(
        f"ratio ingest / raw parse: {ing_rate / raw_rate:.2f}x, fastest runs of {len(ratios)} each "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}x; target >= 0.8x); "
        f"peak RSS {'<' if ing['peak_rss_mb'] < 1024 else '>='} 1 GB"
    )
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
