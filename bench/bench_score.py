"""Benchmark of ``prl score-ref``: tokens/s (prompt + completion tokens read by the reference model).

1. Local backend: a small seeded Llama (built here, nothing downloaded) over a store of random traces, end to end
   (scan, pack, forward, validate, Delta commits). float32 on CPU; on a machine with CUDA the same run uses bf16
   on the GPU and says so.
2. HTTP backends: the same store scored through the tests' 127.0.0.1 server (vLLM ``/v1/completions`` and SGLang
   ``/generate`` shapes, answered from the same model), at request concurrency 1 and 8.
3. Tinker backend (when the ``tinker`` SDK is installed): the real SDK against the tests' Tinker-speaking server
   (``tests/tinker_server.py``, sessions, futures polled, protobuf answers), likewise.

Usage: ``python bench/bench_score.py [--samples 48] [--prompt 256] [--completion 128] [--hidden 256]
[--layers 4] [--vocab 32000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prl.ingestion.traces import ingest
from prl.score import score_ref
from prl.store.tables import Store


def build_model(folder: str, hidden: int, layers: int, vocab: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=4096,
    )
    LlamaForCausalLM(config).save_pretrained(folder)


def write_traces(path: str, samples: int, prompt: int, completion: int, vocab: int) -> None:
    """vLLM ``/v1/completions`` records with ``return_token_ids``."""
    rng = np.random.default_rng(0)
    with open(path, "w") as fh:
        for k in range(samples):
            p = rng.integers(2, vocab, int(rng.integers(prompt // 2, prompt + 1))).tolist()
            c = rng.integers(2, vocab, int(rng.integers(completion // 2, completion + 1))).tolist()
            record = {
                "id": f"b{k}",
                "object": "text_completion",
                "created": 1764460800,
                "model": "bench",
                "choices": [
                    {
                        "index": 0,
                        "text": "x",
                        "logprobs": {"token_logprobs": [-1.0] * len(c), "tokens": [f"token_id:{t}" for t in c]},
                        "finish_reason": "length",
                        "prompt_token_ids": p,
                        "token_ids": c,
                    }
                ],
            }
            fh.write(json.dumps(record) + "\n")


def fresh_store(root: str, traces: str, name: str) -> Store:
    store = Store(os.path.join(root, name))
    ingest([traces], store)
    return store


def report(label: str, result) -> None:
    print(
        f"{label:<34} {result.scored:>5} samples {result.input_tokens:>8,} tokens "
        f"{result.seconds - result.load_seconds:>7.2f} s "
        f"{result.tokens_per_second:>10,.0f} tokens/s"
    )


def bench_tinker(root: str, traces: str, ref) -> None:
    """The Tinker backend through the SDK (skipped without it); the test server's key, no telemetry."""
    try:
        import tinker  # noqa: F401
    except ImportError:
        print("tinker backend: skipped (pip install 'prl[tinker]')")
        return
    from tests.tinker_server import API_KEY, BASE_MODEL, tinker_server

    os.environ["TINKER_API_KEY"] = API_KEY
    os.environ["TINKER_TELEMETRY"] = "0"
    for concurrency in (1, 8):
        with tinker_server(ref) as (url, _):
            store = fresh_store(root, traces, f"tinker-{concurrency}")
            result = score_ref(
                store, "bench", endpoint=url, backend="tinker", served_model=BASE_MODEL, concurrency=concurrency
            )
        report(f"tinker (SDK), concurrency {concurrency}", result)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    import torch

    from tests.score_helpers import Reference, score_server

    with tempfile.TemporaryDirectory() as root:
        model = os.path.join(root, "model")
        build_model(model, args.hidden, args.layers, args.vocab)
        traces = os.path.join(root, "traces.jsonl")
        write_traces(traces, args.samples, args.prompt, args.completion, args.vocab)
        device = "cuda, bf16" if torch.cuda.is_available() else f"cpu, float32, {torch.get_num_threads()} threads"
        print(f"model: Llama hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab} ({device})")
        local = score_ref(fresh_store(root, traces, "local"), "bench", model=model, batch_tokens=8192)
        report("local backend", local)
        ref = Reference(model)
        for kind, suffix in (("vllm", ""), ("sglang", "/generate")):
            for concurrency in (1, 8):
                with score_server(ref) as (url, _):
                    store = fresh_store(root, traces, f"{kind}-{concurrency}")
                    result = score_ref(store, "bench", endpoint=url + suffix, concurrency=concurrency)
                report(f"{kind} endpoint, concurrency {concurrency}", result)
        bench_tinker(root, traces, ref)
    print("(the endpoint's server runs the model one request at a time in this process, unbatched)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
