"""For the Tinker score-ref tests: an HTTP server on 127.0.0.1 that speaks the Tinker service's wire format as
the ``tinker`` SDK (0.38) sends and reads it, answering ``compute_logprobs`` from the tiny model of
:mod:`tests.score_helpers`.

Routes, each as the SDK's resources send them (``tinker/resources/service.py``, ``sampling.py``,
``futures.py``, ``telemetry.py``; ``tinker/lib/internal_client_holder.py``):

- ``GET /api/v1/healthz`` → ``{"status": "ok"}``;
- ``POST /api/v1/client/config`` and ``/client/dynamic_config`` → the feature flags (API-key auth, no
  session futures poller: each result is polled with ``retrieve_future``);
- ``POST /api/v1/create_session``, ``/session_heartbeat``, ``/sessions/{id}/finish``, ``/telemetry``;
- ``POST /api/v1/create_sampling_session`` (``base_model`` or ``model_path``) and ``GET
  /api/v1/samplers/{id}`` (the base model of a ``model_path`` sampler);
- ``POST /api/v1/asample`` → an ``UntypedAPIFuture`` ``{"request_id", "sample_sequence_ids"}``;
- ``POST /api/v1/retrieve_future`` → ``{"type": "try_again", ...}`` while the request is "queued", then the
  ``SampleResponse`` as protobuf (``tinker/proto/tinker_public_pb2``: ``prompt_logprobs`` float32 bytes, NaN
  where no logprob is computed), or ``{"error", "category"}`` for a failed request.

Every request needs ``X-API-Key`` equal to :attr:`TinkerBehaviour.api_key`, else HTTP 401.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from tests.score_helpers import Reference, serving

API_KEY = "tml-test-5b9d2e41"
BASE_MODEL = "tiny/base"


@dataclass
class TinkerBehaviour:
    """How the server answers. ``try_again``: ``retrieve_future`` polls answered "try again" per request before
    its result; ``asample_statuses``: HTTP codes answered to ``asample`` first, in order; ``failed``: results
    answered as failed requests (``category``) first, in order; ``ok_budget``: after this many results every
    request is answered 503; ``fail_always``: every request is answered 503; ``shift``: logprobs one position
    early (the value at position ``i`` is the next token's), ignoring ``prompt_logprobs_last_n``; ``drop``: one
    logprob fewer than the prompt has; ``json_answer``: the result as JSON, which the SDK reads only as protobuf."""

    api_key: str = API_KEY
    try_again: int = 0
    asample_statuses: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    ok_budget: int | None = None
    fail_always: bool = False
    shift: bool = False
    drop: bool = False
    json_answer: bool = False
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    """Every request: (method, path, headers, JSON body or None)."""
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    polls: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    counter: Iterator[int] = field(default_factory=itertools.count)

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies sent to ``path``, in order."""
        return [body for _, p, _, body in self.requests if p == path]


def prompt_logprobs(ref: Reference, request: dict[str, Any], state: TinkerBehaviour) -> np.ndarray:
    """float32 ``[L]`` logprobs of a ``SampleRequest``'s prompt tokens (NaN at 0 and before the last ``n``)."""
    ids = [t for chunk in request["prompt"]["chunks"] for t in chunk["tokens"]]
    values, _ = ref.all_logprobs(ids)
    out = np.full(len(ids), np.nan, np.float32)
    if state.shift:
        out[: len(ids) - 1] = values
        return out
    out[1:] = values
    last_n = request.get("prompt_logprobs_last_n")
    if last_n is not None:
        out[: len(ids) - last_n] = np.nan
    return out[:-1] if state.drop else out


def sample_response(logprobs: np.ndarray) -> bytes:
    """The protobuf ``SampleResponse``: one sampled token (ignored by compute_logprobs) and the prompt logprobs."""
    sequence = pb.SampledSequence(
        stop_reason=pb.STOP_REASON_LENGTH,
        tokens=np.array([0], np.int32).tobytes(),
        logprobs=np.array([-1.0], np.float32).tobytes(),
    )
    return pb.SampleResponse(
        sequences=[sequence], prompt_logprobs=logprobs.astype(np.float32).tobytes()
    ).SerializeToString()


@contextmanager
def tinker_server(ref: Reference, behaviour: TinkerBehaviour | None = None) -> Iterator[tuple[str, TinkerBehaviour]]:
    """Serve the Tinker routes from ``ref`` on 127.0.0.1; yields (base URL, behaviour)."""
    state = behaviour or TinkerBehaviour()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._serve(None)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            self._serve(json.loads(raw) if raw else None)

        def _serve(self, body: Any) -> None:
            path = self.path.split("?")[0]
            with state.lock:
                state.requests.append((self.command, path, dict(self.headers), body))
                if self.headers.get("x-api-key") != state.api_key:
                    return self._json(401, {"detail": "invalid API key"})
                if state.fail_always or (state.ok_budget is not None and state.ok_budget <= 0):
                    return self._json(503, {"detail": "down"})
                answer = self._route(path, body)
            if answer is None:
                return self._json(404, {"detail": f"no route {path}"})
            status, payload = answer
            if isinstance(payload, bytes):
                return self._send(status, payload, "application/x-protobuf")
            return self._json(status, payload)

        def _route(self, path: str, body: Any) -> tuple[int, Any] | None:
            simple = {
                "/api/v1/healthz": {"status": "ok"},
                "/api/v1/client/config": {"pjwt_auth_enabled": False, "sample_use_retrieve_futures": False},
                "/api/v1/client/dynamic_config": {"refresh_interval_sec": 300},
                "/api/v1/create_session": {"type": "create_session", "session_id": "session-1"},
                "/api/v1/session_heartbeat": {"type": "session_heartbeat"},
                "/api/v1/telemetry": {"status": "accepted"},
                "/api/v1/cancel_future": None,
            }
            if path in simple:
                return 200, simple[path]
            if path.startswith("/api/v1/sessions/") and path.endswith("/finish"):
                return 200, None
            if path == "/api/v1/create_sampling_session":
                number = body["sampling_session_seq_id"]
                model = body.get("base_model") or body["model_path"]
                return 200, {"type": "create_sampling_session", "sampling_session_id": f"sampler-{number}|{model}"}
            if path.startswith("/api/v1/samplers/"):
                sampler = path.removeprefix("/api/v1/samplers/")
                return 200, {"sampler_id": sampler, "base_model": BASE_MODEL, "model_path": sampler.split("|")[1]}
            if path == "/api/v1/asample":
                if state.asample_statuses:
                    return state.asample_statuses.pop(0), {"detail": "busy"}
                request_id = f"req-{next(state.counter)}"
                state.pending[request_id] = body
                return 200, {"request_id": request_id, "sample_sequence_ids": [f"{request_id}-seq-0"]}
            if path == "/api/v1/retrieve_future":
                return self._retrieve(body["request_id"])
            return None

        def _retrieve(self, request_id: str) -> tuple[int, Any]:
            polls = state.polls.get(request_id, 0)
            state.polls[request_id] = polls + 1
            if polls < state.try_again:
                return 200, {"type": "try_again", "request_id": request_id, "queue_state": "active"}
            request = state.pending.pop(request_id)
            if state.failed:
                return 200, {"error": "sampler failed", "category": state.failed.pop(0)}
            if state.ok_budget is not None:
                state.ok_budget -= 1
            logprobs = prompt_logprobs(ref, request, state)
            if state.json_answer:
                return 200, {"sequences": [], "prompt_logprobs": [None if np.isnan(v) else float(v) for v in logprobs]}
            return 200, sample_response(logprobs)

        def _json(self, status: int, payload: Any) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _send(self, status: int, data: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    with serving(Handler) as url:
        yield url, state
