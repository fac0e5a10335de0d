"""SSE stream-capture ingest against the raw parse limit of the same file, measured in the same run.

Generates a capture of vLLM chat streams (one token per ``data:`` chunk, ``[DONE]`` after each stream) of
``--mb`` megabytes, then, each in its own process so peak RSS is its own:

1. the raw parse: read the file line by line and ``orjson.loads`` every ``data:`` payload — the least any SSE
   reader must do;
2. ``prl ingest`` of the same file into a fresh store.

Each runs three times (``PRL_BENCH_ROUNDS``), alternating with the other. Prints tokens/s, MB/s and peak RSS of
the fastest runs, and the ratio ingest / raw parse of those (target ≥ 0.5) with the range over rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_ingest import interleaved, prl_ingest_code  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=int(os.environ.get("PRL_BENCH_SSE_MB", "100")))
    args = parser.parse_args()

    from gen_data import make_sse_file

    work = tempfile.mkdtemp(prefix="prl-bench-sse-")
    path = os.path.join(work, "streams.sse")
    started = time.perf_counter()
    stats = make_sse_file(path, args.mb * 1024 * 1024, seed=0)
    size = os.path.getsize(path)
    tokens = stats["prompt_tokens"] + stats["completion_tokens"]
    print(
        f"input: {size / 1e6:.0f} MB, {stats['records']:,} streams, {stats['chunks']:,} chunks, {tokens:,} tokens "
        f"(generated in {time.perf_counter() - started:.1f}s)"
    )
    raw, ing, ratios = interleaved(
        "import orjson\n"
        "t = time.perf_counter()\n"
        "n = 0\n"
        f"with open({path!r}, 'rb') as fh:\n"
        "    for line in fh:\n"
        "        if line.startswith(b'data: {'):\n"
        "            orjson.loads(line[6:])\n"
        "            n += 1\n"
        "out = {'seconds': time.perf_counter() - t, 'chunks': n}\n",
        lambda i: prl_ingest_code(path, os.path.join(work, f"store-{i}")),
    )
    assert ing["samples"] == stats["records"] and not ing["q"], ing
    raw_rate, ing_rate = tokens / raw["seconds"], tokens / ing["seconds"]
    print(
        f"raw SSE parse (orjson per chunk): {raw['seconds']:7.2f} s  {raw_rate / 1e6:6.2f} M tokens/s  "
        f"{size / raw['seconds'] / 1e6:6.1f} MB/s  peak RSS {raw['peak_rss_mb']:6.0f} MB"
    )
    print(
        f"prl ingest (sse)              : {ing['seconds']:7.2f} s  {ing_rate / 1e6:6.2f} M tokens/s  "
        f"{size / ing['seconds'] / 1e6:6.1f} MB/s  peak RSS {ing['peak_rss_mb']:6.0f} MB"
    )
    print(
        f"ratio ingest / raw parse: {ing_rate / raw_rate:.2f}x, fastest runs of {len(ratios)} each "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}x; target >= 0.5x)"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
