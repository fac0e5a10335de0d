"""Chat templates rendered under a time and memory budget, in a worker process.

A chat template is code from a model repository. Jinja's sandbox (transformers renders in
``ImmutableSandboxedEnvironment``) stops it from touching the system, but not from running long or growing big:
nested ``range(100000)`` loops run for hours and ``'x' * 3000000000`` allocates 3 GB, each within the sandbox's
rules. So rendering happens in a worker process (a fresh interpreter running this file, which imports nothing
of prl, so it starts in the time transformers takes to load)
that transformers' sandboxed renderer runs in unchanged, under three budgets:

- time: :data:`RENDER_SECONDS` per conversation; past it the worker is killed (and a new one started for the
  rest), and the conversation gets a ``template_budget`` finding;
- memory: the worker's data segment may grow by :data:`RENDER_MEMORY_BYTES` (``RLIMIT_DATA``); an allocation
  past it fails in the worker (``MemoryError``): ``template_budget``;
- size: a rendering longer than :data:`RENDER_MAX_CHARS` characters is ``template_budget`` too;
- the run: once :data:`MAX_TEMPLATE_TIMEOUTS` conversations (``check-tokens --max-template-timeouts``) have broken
  the time budget, the template is a runaway one: every conversation not rendered yet gets ``template_budget`` at
  once, without a render, so a template that loops on every conversation costs the run a few render budgets, not
  one per conversation. The count belongs to one worker (one checking process: on Ray, one per worker process).

Requests and replies are length-prefixed JSON frames on the worker's stdin / stdout (no pickle); anything a
template or library prints goes to the worker's stderr.
"""

from __future__ import annotations

import os
import select
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import IO, Any

import orjson

RENDER_SECONDS = 5.0
"""Wall-clock seconds one conversation may take to render (real templates take milliseconds)."""
RENDER_MEMORY_BYTES = 1 << 30
"""How far the worker's data segment may grow beyond what it holds once its libraries are loaded."""
RENDER_MAX_CHARS = 32 << 20
"""The longest rendering taken (32 Mi characters: several million tokens of prompt)."""
MAX_TEMPLATE_TIMEOUTS = 3
"""Conversations of a run that may break the time budget before the rest get ``template_budget`` unrendered
(``prl.bounds.TEMPLATE_TIMEOUTS``, the option's default: this file imports nothing of prl)."""
START_SECONDS = 120.0
"""How long a new worker may take to load its libraries (a busy machine is slow to import transformers)."""
_HEADER = struct.Struct(">I")


@dataclass(frozen=True)
class Rendered:
    """One conversation's outcome: ``text`` (rendered), or ``error`` (the template failed: ``template_error``),
    or ``budget`` (it broke a budget: ``template_budget``)."""

    text: str | None = None
    error: str | None = None
    budget: str | None = None


# --- rendering (in the worker) --------------------------------------------------------------------------------
def parse_messages(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) from the stored ``messages`` JSON. Raises ValueError when it is neither form."""
    value = orjson.loads(text)
    tools = None
    if isinstance(value, dict):
        tools = value.get("tools")
        value = value.get("messages")
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ValueError("messages is not a list of message objects")
    if tools is not None and not isinstance(tools, list):
        raise ValueError("tools is not a list")
    return value, tools


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    special_tokens: dict[str, str],
    tokenizer_file: str,
) -> str:
    """``messages`` rendered with ``template`` and ``add_generation_prompt=True`` by transformers' sandboxed
    Jinja renderer; ``special_tokens`` (bos_token, eos_token, …) are the template's variables."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # transformers announces that PyTorch is absent
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:  # older transformers: through a fast tokenizer object
        return _fast_tokenizer(tokenizer_file, tuple(sorted(special_tokens.items()))).apply_chat_template(
            messages, tools=tools, chat_template=template, add_generation_prompt=True, tokenize=False
        )
    renderer: Any = render_jinja_template  # its signature types the template variables too narrowly
    rendered, _ = renderer(
        conversations=[messages], tools=tools, chat_template=template, add_generation_prompt=True, **special_tokens
    )
    return str(rendered[0])


@lru_cache(maxsize=4)
def _fast_tokenizer(tokenizer_file: str, special_tokens: tuple[tuple[str, str], ...]) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, **dict(special_tokens))


def _render_one(request: dict[str, Any], text: str) -> dict[str, str]:
    try:
        messages, tools = parse_messages(text)
        rendered = render_chat(
            request["template"], messages, tools, request["special_tokens"], request["tokenizer_file"]
        )
    except MemoryError:
        return {"budget": f"rendering needs more than {RENDER_MEMORY_BYTES >> 20} MiB of memory"}
    except RecursionError:
        return {"budget": "rendering recursed too deep"}
    except Exception as exc:  # a template error is a finding, not a crash
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if len(rendered) > RENDER_MAX_CHARS:
        return {"budget": f"rendering is longer than {RENDER_MAX_CHARS:,} characters"}
    return {"text": rendered}


def _limit_memory(extra_bytes: int) -> None:
    import resource

    with open("/proc/self/status", encoding="ascii") as fh:
        data_kib = next((int(line.split()[1]) for line in fh if line.startswith("VmData:")), 0)
    limit = data_kib * 1024 + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def serve() -> None:
    """The worker: load the renderer, cap memory, then answer each request's conversations in order, one frame
    per conversation, until stdin closes."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a template or a library prints goes to stderr, never into a frame
    requests = sys.stdin.buffer
    render_chat("{{ 'ready' }}", [], None, {}, "")  # import transformers before the memory cap
    if sys.platform.startswith("linux"):
        _limit_memory(RENDER_MEMORY_BYTES)
    _write_frame(replies, {"ready": True})
    while (request := _read_frame(requests)) is not None:
        for text in request["items"]:
            _write_frame(replies, _render_one(request, text))


def _write_frame(out: IO[bytes], payload: dict[str, Any]) -> None:
    body = orjson.dumps(payload)
    out.write(_HEADER.pack(len(body)) + body)
    out.flush()


def _read_frame(stream: IO[bytes]) -> dict[str, Any] | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    return dict(orjson.loads(stream.read(size)))


# --- the caller's side --------------------------------------------------------------------------------------
class _WorkerGone(Exception):
    """The worker died or missed its deadline (``timed_out``)."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass
class TemplateWorker:
    """A render worker owned by the checking process: started on first use, replaced after a conversation that
    broke the time budget (or killed it), stopped by :meth:`close` (and when the process ends)."""

    seconds: float = RENDER_SECONDS
    max_timeouts: int = MAX_TEMPLATE_TIMEOUTS
    """Conversations that may break the time budget; past them, nothing more is rendered."""
    timeouts: int = 0
    """Conversations that broke the time budget so far."""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _buffer: bytearray = field(default_factory=bytearray, repr=False)

    def render(
        self, template: str, special_tokens: dict[str, str], tokenizer_file: str, texts: list[str]
    ) -> list[Rendered]:
        """Each ``messages`` JSON text of ``texts`` rendered, in order (once :attr:`max_timeouts` renders broke
        the time budget, the rest ``template_budget`` unrendered)."""
        request = {"template": template, "special_tokens": special_tokens, "tokenizer_file": tokenizer_file}
        out: list[Rendered] = []
        while len(out) < len(texts):
            if self.timeouts >= self.max_timeouts:
                skipped = Rendered(budget=self.exhausted())
                out += [skipped] * (len(texts) - len(out))
                break
            pending = texts[len(out) :]
            try:
                self._send({**request, "items": pending})
                for _ in pending:
                    out.append(Rendered(**self._receive(self.seconds)))
            except _WorkerGone as gone:
                self.close()
                self.timeouts += gone.timed_out
                out.append(Rendered(budget=str(gone)))
        return out

    def exhausted(self) -> str:
        """Why a conversation is not rendered once the run's budget of time-outs is spent."""
        return (
            f"not rendered: {self.timeouts} conversations of this run took longer than {self.seconds:g} s to "
            f"render (the run's limit, --max-template-timeouts, is {self.max_timeouts})"
        )

    def _start(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self._buffer.clear()
            self.proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__)],  # -I: no script folder, no user site
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
            )
            try:
                if not self._receive(START_SECONDS, starting=True).get("ready"):
                    raise RuntimeError("the template worker did not start")
            except RuntimeError:
                self.close()
                raise
        return self.proc

    def _send(self, payload: dict[str, Any]) -> None:
        proc = self._start()
        assert proc.stdin is not None
        body = orjson.dumps(payload)
        try:
            proc.stdin.write(_HEADER.pack(len(body)) + body)
            proc.stdin.flush()
        except BrokenPipeError as exc:
            raise _WorkerGone("the template worker stopped") from exc

    def _receive(self, seconds: float, starting: bool = False) -> dict[str, Any]:
        """One reply frame, within ``seconds``."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + seconds
        while True:
            if len(self._buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buffer)
                if len(self._buffer) >= _HEADER.size + size:
                    body = bytes(self._buffer[_HEADER.size : _HEADER.size + size])
                    del self._buffer[: _HEADER.size + size]
                    return dict(orjson.loads(body))
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                if starting:
                    raise RuntimeError(f"the template worker did not start within {seconds:.0f} s")
                raise _WorkerGone(f"rendering took longer than {seconds:g} s", timed_out=True)
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                if starting:
                    raise RuntimeError("the template worker exited while starting (its stderr says why)")
                raise _WorkerGone("the template renderer died (out of memory?)")
            self._buffer += chunk

    def close(self) -> None:
        """Stop the worker (kill it: it may be in the middle of a runaway render)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
            self.proc = None

    def __del__(self) -> None:
        self.close()


if __name__ == "__main__":
    serve()
