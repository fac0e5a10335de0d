"""Shard-building throughput and peak memory, and the cost of the advantage + KL numerics.

Builds a checked store of ``--samples`` samples (≈``--prompt`` prompt + ≈``--completion`` completion tokens each,
groups of ``--group``, rewards, ``ok`` verdicts, reference logprobs), then, each in its own process so peak RSS is
its own:

1. ``build_shards`` with KL into the token advantages (k3), zstd Parquet with byte-stream-split floats, published
   atomically: tokens/s from checked store to published shards (target ≥ 20 M tokens/s on 2 cores), cold (the
   first build in a fresh process, and its peak RSS) and warm (the same build again, ``PRL_BENCH_ROUNDS`` times:
   fastest and median); and after each warm build the floor any builder of these files pays, measured in the
   same process: reading the store's token columns whole plus writing, fsyncing and hashing the same shards
   again, as many at a time as there are cores (the fastest floor, and each round's ratio of floor to build);
2. the advantage + KL step alone (``compute_advantages``, ``masked_kl``, ``kl_into_token_advantages``) against a
   plain numpy pass over the same flat arrays (one subtraction, exp, mean and broadcast): target ratio ≤ 2.

Prints one JSON object. Keep the defaults under a minute on a small machine.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = int(os.environ.get("PRL_BENCH_ROUNDS", "3"))


def _child(code: str) -> dict:
    wrapper = (
        "import json, resource, sys, time\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        f"{code}\n"
        "out['peak_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_store(
    root: str, samples: int, prompt: int, completion: int, group: int, seed: int = 0, first: int = 0, chunk: int = 512
) -> int:
    """A checked store written straight from numpy (samples ``s{first}:0`` on, ``chunk`` samples per commit of each
    table; appended when the store exists); returns the token count written."""
    import numpy as np
    import pyarrow as pa

    sys.path.insert(0, ROOT)
    from prl.schema import CHECKS, REF_LOGPROBS, REWARDS, TRACES
    from prl.store.tables import Store

    def _full(cols: dict[str, pa.Array], schema: pa.Schema, n: int) -> pa.Table:
        """``cols`` as a table of ``schema``, the columns it does not name null (``event_id`` and the like)."""
        return pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in schema}, schema=schema)

    rng = np.random.default_rng(seed)
    store = Store(root)
    now = pa.scalar(0, pa.timestamp("ms", tz="UTC"))
    tokens = 0
    for start in range(first, first + samples, chunk):
        n = min(chunk, first + samples - start)
        ids = [f"s{i}:0" for i in range(start, start + n)]
        p_len = rng.integers(prompt // 2, prompt * 3 // 2, n)
        c_len = rng.integers(completion // 2, completion * 3 // 2, n)
        tokens += int(p_len.sum() + c_len.sum())

        def lists(lengths, values, typ):
            off = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
            return pa.ListArray.from_arrays(pa.array(off), pa.array(values, typ))

        lp = (-rng.exponential(0.7, int(c_len.sum()))).astype(np.float32)
        ref = (lp + rng.normal(0, 0.2, len(lp))).astype(np.float32)
        cols = {
            "sample_id": pa.array(ids),
            "request_id": pa.array(ids),
            "choice_index": pa.array(np.zeros(n, np.int32)),
            "group_id": pa.array([f"g{i // group}" for i in range(start, start + n)]),
            "policy_version": pa.array(["step-10"] * n),
            "prompt_token_ids": lists(p_len, rng.integers(0, 129280, int(p_len.sum()), dtype=np.int32), pa.int32()),
            "completion_token_ids": lists(c_len, rng.integers(0, 129280, int(c_len.sum()), dtype=np.int32), pa.int32()),
            "completion_logprobs": lists(c_len, lp, pa.float32()),
            "finish_reason": pa.array(["stop"] * n),
            "temperature": pa.array(np.ones(n, np.float32)),
            "record_digest": pa.array(ids),
            "source_uri": pa.array(["bench"] * n),
            "source_line": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "source_format": pa.array(["bench"] * n),
            "ingested_at": pa.array([now] * n, pa.timestamp("ms", tz="UTC")),
        }
        table = pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in TRACES}, schema=TRACES)
        store.commit("traces", table.to_batches())
        r = _full(
            {
                "sample_id": pa.array(ids),
                "name": pa.array(["reward"] * n),
                "value": pa.array(rng.integers(0, 2, n).astype(np.float64)),
                "created_at": pa.array([now] * n, pa.timestamp("ms", tz="UTC")),
                "source_uri": pa.array(["bench"] * n),
                "source_line": pa.array(np.arange(n, dtype=np.int64)),
                "ingested_at": pa.array([now] * n, pa.timestamp("ms", tz="UTC")),
            },
            REWARDS,
            n,
        )
        store.commit("rewards", r.to_batches())
        c = pa.table(
            {
                "sample_id": pa.array(ids),
                "tokenizer_fingerprint": pa.array(["bench"] * n),
                "verdict": pa.array(["ok"] * n),
                "reasons": pa.array([[]] * n, pa.list_(pa.string())),
                "checked_at": pa.array([now] * n, pa.timestamp("ms", tz="UTC")),
            }
        )
        store.commit(
            "checks",
            pa.table(
                {f.name: c[f.name] if f.name in c.column_names else pa.nulls(n, f.type) for f in CHECKS}, schema=CHECKS
            ).to_batches(),
        )
        rf = _full(
            {
                "sample_id": pa.array(ids),
                "ref_model": pa.array(["ref"] * n),
                "ref_logprobs": lists(c_len, ref, pa.float32()),
                "source_uri": pa.array(["bench"] * n),
                "source_line": pa.array(np.arange(n, dtype=np.int64)),
                "ingested_at": pa.array([now] * n, pa.timestamp("ms", tz="UTC")),
            },
            REF_LOGPROBS,
            n,
        )
        store.commit("ref_logprobs", rf.to_batches())
    return tokens


BUILD = """
from prl.runtime import set_process_defaults
set_process_defaults()  # as the prl command does, before pyarrow loads
import glob, os, shutil, statistics
from concurrent.futures import ThreadPoolExecutor
import pyarrow.parquet as pq
from prl.store.tables import Store
from prl.shards.build import build_shards
from prl.shards.publish import publish_file
from prl.shards.writer import write_shard
from prl.shards.options import ShardOptions
options = ShardOptions(kl="advantages", kl_coef=0.05, target_tokens={target})
t = time.perf_counter()
res = build_shards(Store({store!r}), {out!r}, options=options)
seconds = time.perf_counter() - t
build_peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the floor reads whole tables

def floor():
    # what any builder of these files pays, in this process: read the token columns of the store (traces and
    # reference logprobs, Parquet), then write the shards just built again with the same writer settings, fsync
    # and sha256, as many at a time as there are cores
    store = Store({store!r})
    t = time.perf_counter()
    store.dataset("traces").to_table(columns=["prompt_token_ids", "completion_token_ids", "completion_logprobs"])
    store.dataset("ref_logprobs").to_table(columns=["ref_logprobs"])
    read_s = time.perf_counter() - t
    tables = [pq.read_table(p) for p in sorted(glob.glob(os.path.join({out!r}, "*", "part-*.parquet")))]
    t = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        def write(i, table):  # the same writer (hashing as it writes), then fsynced and renamed as a build does
            path = os.path.join({work!r}, f"floor-{{i}}.parquet")
            sealed = write_shard(table, path + ".tmp")
            publish_file(path + ".tmp", path)
            return sealed
        list(pool.map(write, range(len(tables)), tables))
    return read_s, time.perf_counter() - t

# the same build again in this process (a long-lived service, or cron's second step: imports, thread pools and the
# page cache are warm), {rounds} times, each followed by the floor; the set is moved aside each time so that
# nothing is skipped as already shipped
warm, floors = [], []
for _ in range({rounds}):
    shutil.rmtree({out!r})
    t = time.perf_counter()
    build_shards(Store({store!r}), {out!r}, options=options)
    warm.append(time.perf_counter() - t)
    floors.append(floor())
best = min(range(len(floors)), key=lambda i: sum(floors[i]))
out = {{"seconds": seconds, "warm_seconds": min(warm), "warm_median_seconds": statistics.median(warm),
        "warm_rounds": warm, "tokens": res.tokens, "rows": res.rows, "shards": len(res.shards),
        "bytes": sum(s["bytes"] for s in res.shards),
        "floor": {{"read_store_s": floors[best][0], "write_hash_s": floors[best][1], "seconds": sum(floors[best])}},
        "round_ratios_to_floor": [sum(f) / w for f, w in zip(floors, warm)],
        "build_peak_rss_mb": build_peak_rss_mb}}
"""

NUMERICS = """
import numpy as np
from prl.numerics import advantages as adv
from prl.numerics import kl
rng = np.random.default_rng(0)
N, L = {samples}, {completion}
off = np.arange(N + 1, dtype=np.int64) * L
lp = -rng.exponential(0.7, N * L)
ref = lp + rng.normal(0, 0.2, N * L)
mask = np.ones(N * L, dtype=bool)
rewards = rng.integers(0, 2, N).astype(np.float64)
groups = np.arange(N) // 4

def ours():
    a = adv.compute_advantages(rewards, groups, "mean")
    d, k, valid = kl.masked_kl(lp, ref, mask, "k3")
    base = kl.broadcast(a.advantages_N, off) * mask
    mean_d = kl.batch_mean_log_ratio(kl.segment_sum(d, off), kl.valid_counts(valid, off))
    return kl.kl_into_token_advantages(base, d, valid, 0.05, mean_d), kl.segment_sum(k, off)

def plain():
    d = lp - ref
    k = np.exp(-d) + d - 1
    return np.repeat(rewards, L) + 0.05 * (d.mean() - d), k.sum()

def best(fn):
    times = []
    for _ in range(5):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)

t_ours, t_plain = best(ours), best(plain)
out = {{"tokens": N * L, "ours_s": t_ours, "plain_s": t_plain, "ratio": t_ours / t_plain,
        "ours_tokens_per_s": N * L / t_ours}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--completion", type=int, default=1000)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--target-tokens", type=int, default=2_000_000)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="prl-bench-shards-")
    try:
        t = time.perf_counter()
        tokens = make_store(os.path.join(work, "store"), args.samples, args.prompt, args.completion, args.group)
        setup = time.perf_counter() - t
        build = _child(
            BUILD.format(
                store=os.path.join(work, "store"),
                out=os.path.join(work, "out"),
                work=work,
                target=args.target_tokens,
                rounds=ROUNDS,
            )
        )
        numerics = _child(NUMERICS.format(samples=args.samples, completion=args.completion))
        result = {
            "store_tokens": tokens,
            "setup_seconds": round(setup, 2),
            "build": build,
            "build_tokens_per_s": build["tokens"] / build["seconds"],
            "build_tokens_per_s_warm": build["tokens"] / build["warm_seconds"],
            "build_tokens_per_s_warm_median": build["tokens"] / build["warm_median_seconds"],
            "floor_tokens_per_s": build["tokens"] / build["floor"]["seconds"],
            "ratio_warm_to_floor": build["floor"]["seconds"] / build["warm_seconds"],
            "numerics": numerics,
            "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
