"""What the endpoint backends share: one pooled HTTP client, bounded concurrency, retries with backoff.

Each sample is one JSON request (the server batches requests itself); at most ``concurrency`` are in flight.
A request that meets HTTP 408/429/5xx, a timeout or a connection error is retried with exponential backoff and
jitter (``Retry-After`` is honoured when the server sends one, up to 60 s); when the retries run out the run stops
with :class:`~prl.errors.RetryableIOError` (exit 5) and the batches committed before stay. 401/403/404 are
configuration errors (exit 2). Any other 4xx answer is about the sample itself (too long for the model, a token
ID out of its vocabulary): that sample is quarantined as ``endpoint_rejected``.

Credentials come from the environment only: ``PRL_REF_API_KEY``, else ``OPENAI_API_KEY``, sent as a bearer token.
Neither the key nor the request headers appear in any message prl prints.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
import orjson

from prl import bounds
from prl.errors import RetryableIOError, UsageError
from prl.formats.base import Quarantined
from prl.score.base import Outcome, ScoreRequest

log = logging.getLogger(__name__)

API_KEY_ENV = ("PRL_REF_API_KEY", "OPENAI_API_KEY")
"""Environment variables read, in order, for the bearer token."""
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
CONFIG_STATUS = frozenset({401, 403, 404, 405})
MAX_RETRY_AFTER = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` further attempts after the first, waiting ``base × 2^attempt`` seconds (×0.5–1.5 jitter,
    at most ``cap``) between them."""

    retries: int = 5
    base: float = 0.5
    cap: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), MAX_RETRY_AFTER)
        return min(self.cap, self.base * 2**attempt) * random.uniform(0.5, 1.5)


def api_key() -> str | None:
    """The bearer token from ``PRL_REF_API_KEY`` or ``OPENAI_API_KEY`` (None when neither is set)."""
    for name in API_KEY_ENV:
        value = os.environ.get(name)
        if value:
            return value
    return None


def public_url(url: str) -> str:
    """``url`` without user info, query or fragment: what may be printed and recorded as a row's source."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def _retry_after(response: httpx2.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class EndpointClient:
    """POSTs JSON to one endpoint with bounded concurrency and retries. Thread-safe; :meth:`close` it."""

    def __init__(
        self,
        url: str,
        *,
        concurrency: int = bounds.CONCURRENCY,
        timeout: float = bounds.TIMEOUT_S,
        retry: RetryPolicy | None = None,
    ) -> None:
        if urlsplit(url).scheme not in ("http", "https"):
            raise UsageError(f"--endpoint must be an http:// or https:// URL, got {public_url(url)!r}")
        if concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, got {concurrency}")
        self.url = url
        self.source = public_url(url)
        self.concurrency = concurrency
        self.retry = retry or RetryPolicy()
        headers = {"content-type": "application/json"}
        key = api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client = httpx2.Client(headers=headers, timeout=timeout, limits=limits)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="prl-score")
        self._down = threading.Event()
        """Set once a request ran out of retries: the requests still queued stop without trying."""
        self._down_reason = ""
        self._lock = threading.Lock()

    def close(self) -> None:
        """Drop queued requests and close the connections (a request still in flight, after an interrupt or a
        failure, ends with a closed connection instead of holding the process for its timeout)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def map(
        self,
        requests: Sequence[ScoreRequest],
        payload: Callable[[ScoreRequest], dict[str, Any]],
        parse: Callable[[Any, ScoreRequest], Outcome],
    ) -> list[Outcome]:
        """POST ``payload(request)`` for every request (``concurrency`` at a time) and ``parse`` each JSON answer;
        one outcome per request, in order. The first request whose retries run out raises
        :class:`RetryableIOError` after the requests in flight finish."""
        futures = [self._pool.submit(self._one, r, payload, parse) for r in requests]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for future in futures:  # those not started yet; the ones in flight end on their own
                future.cancel()
            raise

    def _one(
        self,
        request: ScoreRequest,
        payload: Callable[[ScoreRequest], dict[str, Any]],
        parse: Callable[[Any, ScoreRequest], Outcome],
    ) -> Outcome:
        body = orjson.dumps(payload(request))
        attempt = 0
        while True:
            if self._down.is_set():
                raise RetryableIOError(self._down_reason)
            problem, wait_hint = self._post(body)
            if isinstance(problem, httpx2.Response):
                status = problem.status_code
                if status < 300:
                    try:
                        answer = orjson.loads(problem.content)
                    except orjson.JSONDecodeError:
                        return Quarantined(
                            "bad_response", f"{self.source} answered {status} with a body that is not JSON"
                        )
                    return parse(answer, request)
                if status in CONFIG_STATUS:
                    raise UsageError(
                        f"{self.source} answered HTTP {status}: {_excerpt(problem)} (check --endpoint and the API key variable)"
                    )
                if status not in RETRY_STATUS:
                    return Quarantined("endpoint_rejected", f"HTTP {status}: {_excerpt(problem)}")
                problem = f"HTTP {status}"
            if attempt >= self.retry.retries:
                reason = (
                    f"{self.source} is unavailable: {problem} after {attempt + 1} attempts; "
                    "committed batches are kept, rerun to score the rest"
                )
                with self._lock:
                    if not self._down.is_set():
                        self._down_reason = reason
                        self._down.set()
                raise RetryableIOError(self._down_reason)
            delay = self.retry.delay(attempt, wait_hint)
            log.info("%s: %s; retrying in %.1fs", self.source, problem, delay)
            time.sleep(delay)
            attempt += 1

    def _post(self, body: bytes) -> tuple[httpx2.Response | str, float | None]:
        """One POST: the response, or a description of the transport error (timeouts, refused connections)."""
        try:
            response = self._client.post(self.url, content=body)
        except httpx2.TimeoutException:
            return "timed out", None
        except httpx2.TransportError as exc:
            return f"{type(exc).__name__}", None
        return response, _retry_after(response)


def _excerpt(response: httpx2.Response, limit: int = 300) -> str:
    text = response.text.strip().replace("\n", " ")
    return text[:limit] + ("…" if len(text) > limit else "")
