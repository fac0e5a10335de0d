"""build-shards peak memory as the store grows: is it flat in the number of samples?

Grows one checked store (rewards, ``ok`` verdicts, reference logprobs; samples of ≈``--prompt`` + ≈``--completion``
tokens, groups of ``--group``) to each size of ``--tokens`` in turn, and at each size builds every sample into a
fresh OUT in a fresh process (KL into the token advantages, as ``bench_shards.py``) three ways
(:data:`VARIANTS`): as the ``prl`` command builds (sets of at most ``max_set_samples`` rows, in turns, with its
allocator settings: Arrow's mimalloc and polars' jemalloc hand freed pages back after a second,
:mod:`prl.runtime`), in one set (``max_set_samples = None``), and in turns with both allocators keeping freed
pages (``MIMALLOC_PURGE_DELAY=-1`` and jemalloc's defaults, 10 s).
Reports per size: samples, tokens, and for each way sets, shards, seconds, tokens/s and peak RSS (MB); then the
growth of peak RSS in bytes per sample, from each size to the next (``growth_bytes_per_sample``) and from the smallest to
the largest (``peak_rss_growth_mb_per_million_samples``, the same in MB per million samples). The store is
written ``--chunk`` samples per commit.

Sizes should start above :data:`prl.shards.gather.WORKERS` + 1 row groups
(:data:`prl.shards.rowgroups.ROW_GROUP_TOKENS`, 1 Mi tokens): below that, fewer row groups than workers are in
memory at once, so peak RSS follows the row groups being built, not the store, and the growth from such a size
(marked ``"below_steady_state": true``) counts their buffers too. The defaults (5, 50 and 200 M tokens; ``make
bench`` runs them) take about three minutes and 1.6 GB of disk on a small machine: 381 / 414 / 441 MB peak in
turns (1 / 3 / 9 sets), against 370 / 414 / 546 MB in one set, on the 2-core machine (a size's peak moves by
20–40 MB from run to run: the allocators hand pages back on timers). ``--tokens 5e6,50e6,200e6,500e6`` adds a
4 GB store and several more minutes.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
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

from bench_shards import make_store  # noqa: E402  (this folder's own helper)

sys.path.insert(0, ROOT)
from prl.shards.gather import WORKERS  # noqa: E402
from prl.shards.rowgroups import ROW_GROUP_TOKENS  # noqa: E402

BUILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from prl.runtime import set_process_defaults
set_process_defaults()  # as the prl command does (what the environment sets wins)
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.store.tables import Store
t = time.perf_counter()
options = ShardOptions(kl="advantages", kl_coef=0.05, **{options!r})
res = build_shards(Store({store!r}), {out!r}, options=options)
seconds = time.perf_counter() - t
sets = res.sets or [{{"shards": len(res.shards)}}]
print(json.dumps({{"seconds": seconds, "tokens": res.tokens, "rows": res.rows, "sets": len(sets),
                  "shards": sum(s["shards"] for s in sets),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

KEEP_PAGES = {"MIMALLOC_PURGE_DELAY": "-1", "_RJEM_MALLOC_CONF": ""}
VARIANTS: dict[str, tuple[dict[str, str], dict]] = {
    "prl_defaults": ({}, {}),
    "one_set": ({}, {"max_set_samples": None}),
    "keep_pages": (KEEP_PAGES, {}),
}
"""Name in the report → (the build process's environment over the ``prl`` command's defaults, build options
over the defaults): as ``prl build-shards`` builds (sets of at most ``max_set_samples`` rows, in turns), every
sample in one set, and in turns with the allocators keeping freed pages."""


def build_once(store: str, out: str, variant: tuple[dict[str, str], dict]) -> dict:
    """One build of every sample of ``store`` into a fresh ``out``, in its own process."""
    shutil.rmtree(out, ignore_errors=True)
    settings, options = variant
    env = {**os.environ, **settings}
    code = BUILD.format(root=ROOT, store=store, out=out, options=options)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="5e6,50e6,200e6", help="comma-separated store sizes, in tokens")
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--completion", type=int, default=300)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=4096, help="samples per commit while the store is grown")
    args = parser.parse_args()
    sizes = sorted(int(float(v)) for v in args.tokens.split(","))
    per_sample = args.prompt + args.completion
    work = tempfile.mkdtemp(prefix="prl-bench-shards-memory-")
    store, out = os.path.join(work, "store"), os.path.join(work, "out")
    rows: list[dict] = []
    samples = tokens = 0
    try:
        for size in sizes:
            more = max(0, (size - tokens) // per_sample)
            t = time.perf_counter()
            tokens += make_store(
                store, more, args.prompt, args.completion, args.group, seed=len(rows), first=samples, chunk=args.chunk
            )
            samples += more
            row: dict = {"samples": samples, "tokens": tokens, "setup_seconds": round(time.perf_counter() - t, 1)}
            if tokens < (WORKERS + 1) * ROW_GROUP_TOKENS:
                row["below_steady_state"] = True
            for name, variant in VARIANTS.items():
                build = build_once(store, out, variant)
                assert build["rows"] == samples, build
                row[name] = {
                    "sets": build["sets"],
                    "shards": build["shards"],
                    "seconds": round(build["seconds"], 2),
                    "tokens_per_s": round(build["tokens"] / build["seconds"]),
                    "peak_rss_mb": round(build["peak_rss_mb"]),
                }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        first, last = rows[0], rows[-1]
        growth = {
            name: round(
                (last[name]["peak_rss_mb"] - first[name]["peak_rss_mb"])
                / max(1e-9, (last["samples"] - first["samples"]) / 1e6)
            )
            for name in VARIANTS
        }
        steps = [
            {
                "from_samples": a["samples"],
                "to_samples": b["samples"],
                **{
                    name: round(
                        (b[name]["peak_rss_mb"] - a[name]["peak_rss_mb"]) * 2**20 / max(1, b["samples"] - a["samples"])
                    )
                    for name in VARIANTS
                },
            }
            for a, b in itertools.pairwise(rows)
        ]
        report = {"sizes": rows, "growth_bytes_per_sample": steps, "peak_rss_growth_mb_per_million_samples": growth}
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
