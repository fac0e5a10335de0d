"""For the score-ref tests: a tiny random causal LM, a store of traces over its vocabulary, and an HTTP server
on 127.0.0.1 that answers vLLM's ``/v1/completions`` and SGLang's ``/generate`` shapes from that model."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from prl.ingestion.traces import ingest
from prl.store.tables import Store
from tests.records import vllm_chat

VOCAB = 300


def build_tiny_model(folder: Path, seed: int = 0, vocab: int = VOCAB) -> Path:
    """A seeded, randomly initialised 2-layer Llama saved as a transformers folder (nothing downloaded)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


class Reference:
    """Direct, unbatched forward passes over the tiny model: what every backend must reproduce."""

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.lock = threading.Lock()

    def all_logprobs(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """``[L-1]`` log p(x_i | x_<i) for i ≥ 1, and each one's rank (1 = most likely) among the vocabulary."""
        torch = self.torch
        with self.lock, torch.inference_mode():
            logits = self.model(torch.tensor([ids])).logits[0, :-1].float()
            lp = logits.log_softmax(-1)
            target = torch.tensor(ids[1:]).unsqueeze(-1)
            picked = lp.gather(-1, target).squeeze(-1)
            ranks = (lp > picked.unsqueeze(-1)).sum(-1) + 1
        return picked.double().numpy(), ranks.numpy()

    def completion(self, prompt: list[int], completion: list[int]) -> np.ndarray:
        values, _ = self.all_logprobs([*prompt, *completion])
        return values[len(prompt) - 1 :]


def write_traces(folder: Path, n: int, seed: int = 0, vocab: int = VOCAB, start: int = 0) -> dict[str, tuple]:
    """A JSONL of ``n`` vLLM chat records over token IDs in [2, vocab); returns sample_id → (prompt, completion)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    samples: dict[str, tuple] = {}
    lines = []
    for k in range(start, start + n):
        prompt = rng.integers(2, vocab, int(rng.integers(2, 24))).tolist()
        choices = []
        for _ in range(int(rng.integers(1, 3))):
            ids = rng.integers(2, vocab, int(rng.integers(1, 16))).tolist()
            choices.append((ids, np.round(-rng.exponential(1.0, len(ids)), 4).tolist()))
        lines.append(json.dumps(vllm_chat(f"r{seed}-{k}", prompt, choices)))
        for c, (ids, _) in enumerate(choices):
            samples[f"r{seed}-{k}#{c}"] = (prompt, ids)
    with open(folder / f"traces-{seed}-{start}.jsonl", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return samples


def traces_store(root: Path, n: int, seed: int = 0) -> tuple[Store, dict[str, tuple]]:
    """A store holding ``n`` ingested records (see :func:`write_traces`)."""
    samples = write_traces(root / "in", n, seed)
    store = Store(str(root / "store"))
    ingest([str(root / "in")], store)
    return store, samples


@dataclass
class Behaviour:
    """How the test server answers. ``statuses``: HTTP codes answered first, in order, before normal answers
    (``fail_always`` answers 500 forever); ``ok_budget``: after this many good answers, every answer is 503;
    ``shift``: answer for other token IDs (each one higher); ``api_key``: required bearer token."""

    statuses: list[int] = field(default_factory=list)
    fail_always: bool = False
    ok_budget: int | None = None
    shift: bool = False
    api_key: str | None = None
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def vllm_answer(ref: Reference, body: dict[str, Any], shift: bool) -> dict[str, Any]:
    ids = body["prompt"]
    values, ranks = ref.all_logprobs(ids)
    entries: list[Any] = [None]
    for i in range(1, len(ids)):
        key = str((ids[i] + 1) % VOCAB if shift else ids[i])
        entries.append({key: {"logprob": float(values[i - 1]), "rank": int(ranks[i - 1]), "decoded_token": "t"}})
    return {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": 1764460800,
        "model": body.get("model", "tiny"),
        "choices": [
            {
                "index": 0,
                "text": "t",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": entries,
            }
        ],
        "usage": {"prompt_tokens": len(ids), "total_tokens": len(ids) + 1, "completion_tokens": 1},
    }


def sglang_answer(ref: Reference, body: dict[str, Any], shift: bool) -> dict[str, Any]:
    ids, start = body["input_ids"], body["logprob_start_len"]
    values, _ = ref.all_logprobs(ids)
    triples = []
    for i in range(start, len(ids)):
        token = (ids[i] + 1) % VOCAB if shift else ids[i]
        triples.append([None if i == 0 else float(values[i - 1]), token, None])
    meta = {
        "id": "gen-test",
        "finish_reason": {"type": "length", "length": 0},
        "prompt_tokens": len(ids),
        "completion_tokens": 0,
        "cached_tokens": 0,
        "input_token_logprobs": triples,
        "output_token_logprobs": [],
        "e2e_latency": 0.01,
    }
    return {"text": "", "output_ids": [], "meta_info": meta}


@contextmanager
def score_server(ref: Reference, behaviour: Behaviour | None = None) -> Iterator[tuple[str, Behaviour]]:
    """Serve ``/v1/completions`` and ``/generate`` from ``ref`` on 127.0.0.1; yields (base URL, behaviour)."""
    state = behaviour or Behaviour()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            with state.lock:
                state.bodies.append(body)
                state.headers.append(dict(self.headers))
                if state.api_key and self.headers.get("authorization") != f"Bearer {state.api_key}":
                    return self._send(401, {"error": "unauthorized"})
                if state.fail_always:
                    return self._send(500, {"error": "boom"})
                if state.statuses:
                    return self._send(state.statuses.pop(0), {"error": "busy"})
                if state.ok_budget is not None:
                    if state.ok_budget <= 0:
                        return self._send(503, {"error": "down"})
                    state.ok_budget -= 1
            if self.path == "/v1/completions":
                return self._send(200, vllm_answer(ref, body, state.shift))
            if self.path == "/generate":
                return self._send(200, sglang_answer(ref, body, state.shift))
            return self._send(404, {"error": "no such route"})

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    with serving(Handler) as url:
        yield url, state


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 answering with ``handler``, for the ``with`` block; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
