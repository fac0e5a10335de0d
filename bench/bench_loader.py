"""ShardLoader against plain pyarrow reading the same rows.

Builds a shard set of ``--samples`` samples in groups of ``--group`` (default 1, the case where a loader that
reads group by group is slowest; ≈``--prompt`` + ≈``--completion`` tokens each, reference logprobs, KL), then,
each in its own process:

1. ``loader``: one epoch of ``ShardLoader(OUT, batch_rows=--batch, layout="rows")`` (shuffled): process start to
   last batch, and the time per batch (the plan and each part's decoding included);
2. ``pyarrow``: the same batches read with plain pyarrow: every part read whole (``pyarrow.parquet.read_table``,
   the loader's columns) and one ``Table.take`` of each batch's rows per part, in the loader's order (the rows are
   the loader's: its plan is written to a file first);
3. ``padded``: the same epoch as padded numpy batches (``layout="padded"``), for what trainers take.

Target: ``loader`` per batch ≤ 2 × ``pyarrow`` per batch, in wall time and in CPU time (the process's own, which
other work on a shared machine does not inflate); exits 1 when both miss it. Prints one JSON object.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_shards import make_store  # noqa: E402


def _child(code: str) -> dict:
    wrapper = (
        "import json, resource, sys, time\n"
        "t_start = time.perf_counter()\n"
        "c_start = time.process_time()\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        f"{code}\n"
        "out['peak_rss_mb'] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)\n"
        "print(json.dumps(out))\n"
    )
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = round(time.perf_counter() - t0, 3)
    return out


LOADER = """
import numpy as np
from prl.loaders import ShardLoader
t0, c0 = time.perf_counter(), time.process_time()
loader = ShardLoader({out!r}, batch_rows={batch}, layout={layout!r}, seed=0)
batches = rows = 0
for b in loader:
    batches += 1
    rows += (b if {layout!r} == "rows" else b.rows).num_rows
epoch_s, epoch_cpu_s = time.perf_counter() - t0, time.process_time() - c0
out = {{"batches": batches, "rows": rows, "epoch_s": round(epoch_s, 3), "epoch_cpu_s": round(epoch_cpu_s, 3),
       "per_batch_ms": round(1000 * epoch_s / max(batches, 1), 2),
       "per_batch_cpu_ms": round(1000 * epoch_cpu_s / max(batches, 1), 2),
       "import_to_end_s": round(time.perf_counter() - t_start, 3),
       "import_to_end_cpu_s": round(time.process_time() - c_start, 3)}}
"""

PLAN = """
import numpy as np
from prl.loaders import ShardLoader
loader = ShardLoader({out!r}, batch_rows={batch}, layout="rows", seed=0)
plan = loader._plan(0)
g = loader._groups
parts, rows, batch_of = [], [], []
for k in range(len(plan)):
    row_R = g.rows_of(plan.groups[plan.bounds_K1[k]:plan.bounds_K1[k + 1]])
    part_R = np.searchsorted(g.part_row0_P1, row_R, side="right") - 1
    parts.append(part_R); rows.append(row_R - g.part_row0_P1[part_R]); batch_of.append(np.full(len(row_R), k))
np.savez({plan_file!r}, part=np.concatenate(parts), row=np.concatenate(rows), batch=np.concatenate(batch_of),
         paths=np.array([p.path for p in loader._parts]))
out = {{"batches": len(plan)}}
"""

PYARROW = """
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from prl.loaders.rows import ROW_COLUMNS
t0, c0 = time.perf_counter(), time.process_time()
plan = np.load({plan_file!r})
part_R, row_R, batch_R, paths = plan["part"], plan["row"], plan["batch"], plan["paths"].tolist()
columns = [c for c in (*ROW_COLUMNS, "temperature") if c in pq.read_schema(paths[0]).names]
cache = {{}}
batches = rows = 0
cuts = np.concatenate(([0], np.flatnonzero(np.diff(batch_R)) + 1, [len(batch_R)]))
for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
    p_B, r_B = part_R[a:b], row_R[a:b]
    runs = np.concatenate(([0], np.flatnonzero(np.diff(p_B)) + 1, [len(p_B)]))
    pieces = []
    for x, y in zip(runs[:-1].tolist(), runs[1:].tolist()):
        p = int(p_B[x])
        if p not in cache:
            cache[p] = pq.read_table(paths[p], columns=columns)
            while len(cache) > 2:
                cache.pop(next(iter(cache)))
        pieces.append(cache[p].take(pa.array(r_B[x:y])))
    table = pa.concat_tables(pieces)
    batches += 1
    rows += table.num_rows
epoch_s, epoch_cpu_s = time.perf_counter() - t0, time.process_time() - c0
out = {{"batches": batches, "rows": rows, "epoch_s": round(epoch_s, 3), "epoch_cpu_s": round(epoch_cpu_s, 3),
       "per_batch_ms": round(1000 * epoch_s / max(batches, 1), 2),
       "per_batch_cpu_ms": round(1000 * epoch_cpu_s / max(batches, 1), 2),
       "import_to_end_s": round(time.perf_counter() - t_start, 3),
       "import_to_end_cpu_s": round(time.process_time() - c_start, 3)}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--completion", type=int, default=300)
    parser.add_argument("--group", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--target-tokens", type=int, default=2_000_000)
    parser.add_argument("--keep", help="build here and keep it (default: a temporary folder, removed)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from prl.shards.build import build_shards
    from prl.shards.options import ShardOptions
    from prl.store.tables import Store

    root = args.keep or tempfile.mkdtemp(prefix="prl-bench-loader-")
    try:
        store, out = os.path.join(root, "store"), os.path.join(root, "out")
        t0 = time.perf_counter()
        tokens = parts = rows = None
        if not os.path.isdir(out):  # --keep of a folder built before: reuse it
            tokens = make_store(store, args.samples, args.prompt, args.completion, args.group, chunk=8192)
            res = build_shards(
                Store(store), out, options=ShardOptions(target_tokens=args.target_tokens, kl="advantages", kl_coef=0.05)
            )
            parts, rows = len(res.shards), res.rows
        setup_s = time.perf_counter() - t0
        plan_file = os.path.join(root, "plan.npz")
        _child(PLAN.format(out=out, batch=args.batch, plan_file=plan_file))
        loader = _child(LOADER.format(out=out, batch=args.batch, layout="rows"))
        arrow = _child(PYARROW.format(plan_file=plan_file))
        padded = _child(LOADER.format(out=out, batch=args.batch, layout="padded"))
        assert loader["rows"] == arrow["rows"] == padded["rows"] and rows in (None, loader["rows"]), (loader, arrow)
        result = {
            "samples": args.samples,
            "group": args.group,
            "tokens": tokens,
            "rows": loader["rows"],
            "parts": parts,
            "batch_rows": args.batch,
            "setup_s": round(setup_s, 1),
            "loader": loader,
            "pyarrow": arrow,
            "padded": padded,
            "ratio_per_batch": round(loader["per_batch_ms"] / max(arrow["per_batch_ms"], 1e-9), 2),
            "ratio_per_batch_cpu": round(loader["per_batch_cpu_ms"] / max(arrow["per_batch_cpu_ms"], 1e-9), 2),
            "target_ratio": 2.0,
        }
        print(json.dumps(result, indent=1))
        return 0 if min(result["ratio_per_batch"], result["ratio_per_batch_cpu"]) <= 2.0 else 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
