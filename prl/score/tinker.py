"""Reference logprobs from a Tinker service through the ``tinker`` SDK (the ``prl[tinker]`` extra):
``SamplingClient.compute_logprobs`` over prompt + completion token IDs.

What the SDK (0.38) sends, all JSON ``POST`` s under the base URL unless said (``tinker/resources/*.py``,
``tinker/lib/internal_client_holder.py``, ``tinker/lib/api_future_impl.py``), each with ``X-API-Key``:
``/api/v1/client/config`` and ``/client/dynamic_config`` (feature flags), ``/api/v1/create_session`` (then
``/session_heartbeat`` every 10 s and ``/telemetry`` batches), ``/api/v1/create_sampling_session``
(``base_model``, or ``model_path`` ``tinker://…`` and then ``GET /api/v1/samplers/{id}`` for its base model);
per request ``/api/v1/asample`` (``prompt.chunks[0]`` ``{"type": "encoded_text", "tokens": [...]}``,
``sampling_params.max_tokens`` 1, ``prompt_logprobs`` true, ``prompt_logprobs_last_n``) answered with a future
``{"request_id", "sample_sequence_ids"}``, then ``/api/v1/retrieve_future`` ``{"request_id"}`` polled (``Accept:
application/x-protobuf``) until the ``SampleResponse`` comes (protobuf: ``prompt_logprobs`` float32, NaN where
none is computed) instead of ``{"type": "try_again"}``; ``/api/v1/sessions/{id}/finish`` on close.

The request scores only the completion (``prompt_logprobs_last_n`` = completion length, so the service may take
the prompt from its prefix cache): the answer has one entry per input token, ``None`` before the completion. The
entries at the completion positions are the reference logprobs. An answer of another length is quarantined
(``length_mismatch``); one with a logprob before the completion (the SDK's own check raises for it; a service
that ignores ``prompt_logprobs_last_n`` answers so too) is ``misaligned``; a missing or non-finite completion
logprob is ``nonfinite_logprob``; an answer the SDK cannot read (not protobuf, say) is ``bad_response``.

``--endpoint`` is the service's base URL (the SDK's ``base_url``; its default deployment is
``https://tinker.thinkingmachines.dev/services/tinker-prod``), ``--served-model`` a base model name or a
``tinker://`` checkpoint path. Credentials are the SDK's: ``TINKER_API_KEY`` (or ``TINKER_CREDENTIAL_CMD``, or
a key stored by ``tinker auth login``); prl never reads, sends or prints the key itself.

Faults: the SDK retries 5xx, 408, 429 and connection errors itself, for minutes. prl bounds each attempt to
``timeout`` seconds (SDK retries included) and retries a timed-out attempt, or a request the service reports
failed on its side, with the endpoint backends' backoff; when the retries run out, when ``GET /api/v1/healthz``
never answers, or when no sampling session opens within ``timeout``, the run stops with
:class:`~prl.errors.RetryableIOError` (exit 5).
HTTP 401/403/404 and a missing or malformed key are configuration errors (exit 2); any other 4xx, or a request
the service fails as the caller's fault, quarantines that sample (``endpoint_rejected``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn
from urllib.parse import urlsplit

import httpx2
import numpy as np

from prl import bounds
from prl.errors import RetryableIOError, UsageError
from prl.formats.base import Quarantined
from prl.score.base import Outcome, ScoreRequest, answer_empty, completion_logprobs
from prl.score.http import CONFIG_STATUS, RETRY_STATUS, RetryPolicy, public_url

log = logging.getLogger(__name__)

MODEL_PATH_PREFIX = "tinker://"
HEALTH_PATH = "/api/v1/healthz"
CLOSE_SECONDS = 10.0
"""At most this long (and at most ``timeout``) is spent finishing the session on close."""


def _sdk() -> Any:
    try:
        import tinker
    except ImportError as exc:
        raise UsageError("--backend tinker needs the tinker SDK: pip install 'prl[tinker]'") from exc
    return tinker


def check_answer(values: Any, request: ScoreRequest) -> Outcome:
    """Completion-aligned logprobs from ``compute_logprobs``' answer (see the module doc): ``values`` has one
    entry per input token, ``None`` before the completion."""
    if not isinstance(values, list):
        return Quarantined("bad_response", f"compute_logprobs answered {type(values).__name__}, not a list")
    total, start = request.tokens, len(request.prompt_ids)
    if len(values) != total:
        return Quarantined("length_mismatch", f"{len(values)} prompt logprobs for {total} input tokens")
    try:
        array = np.array(values, dtype=np.float64)  # None → NaN
    except (TypeError, ValueError):
        return Quarantined("bad_response", "compute_logprobs answered entries that are not numbers")
    early = np.flatnonzero(~np.isnan(array[:start]))
    if len(early):
        return Quarantined(
            "misaligned", f"answer has a logprob at prompt position {int(early[0])}; only the completion was asked"
        )
    return completion_logprobs(array[start:], request)


class TinkerBackend:
    """Scores requests with a Tinker sampling client (see the module doc). :meth:`close` it."""

    name = "tinker"

    def __init__(
        self,
        url: str,
        *,
        served_model: str | None,
        concurrency: int = bounds.CONCURRENCY,
        timeout: float = bounds.TIMEOUT_S,
        retry: RetryPolicy | None = None,
    ) -> None:
        if urlsplit(url).scheme not in ("http", "https"):
            raise UsageError(f"--endpoint must be an http:// or https:// URL, got {public_url(url)!r}")
        if not served_model:
            raise UsageError("--backend tinker needs --served-model: a base model name or a tinker:// checkpoint path")
        if concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, got {concurrency}")
        self.tinker = _sdk()
        self.url = url.rstrip("/")
        self.source = public_url(url)
        self.served_model = served_model
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="prl-score-tinker")
        self._down = threading.Event()
        self._down_reason = ""
        self._lock = threading.Lock()
        self._failed = False
        self._service: Any = None
        self.sampler: Any = None
        try:
            self._probe()
            self.sampler = self._open_bounded()
        except BaseException:
            self.close()
            raise

    # --- session ---------------------------------------------------------------------------------------------
    def _probe(self) -> None:
        """``GET /api/v1/healthz`` until any answer but 408/429/5xx comes: the service is up."""
        attempt = 0
        with httpx2.Client(timeout=min(self.timeout, 30.0)) as client:
            while True:
                try:
                    status = client.get(self.url + HEALTH_PATH).status_code
                    problem = f"HTTP {status}" if status in RETRY_STATUS else None
                except httpx2.TimeoutException:
                    problem = "timed out"
                except httpx2.TransportError as exc:
                    problem = type(exc).__name__
                if problem is None:
                    return
                self._wait_or_give_up(attempt, problem)
                attempt += 1

    def _open(self) -> Any:
        """A ``SamplingClient`` for ``served_model`` (a base model name or a ``tinker://`` path)."""
        tinker = self.tinker
        try:
            self._service = tinker.ServiceClient(base_url=self.url)
            if self.served_model.startswith(MODEL_PATH_PREFIX):
                return self._service.create_sampling_client(model_path=self.served_model).result()
            return self._service.create_sampling_client(base_model=self.served_model).result()
        except tinker.APIStatusError as exc:
            if exc.status_code in CONFIG_STATUS or exc.status_code not in RETRY_STATUS:
                raise UsageError(
                    f"{self.source} answered HTTP {exc.status_code} opening a sampling session for "
                    f"{self.served_model!r}: {exc.message} (check --endpoint, --served-model and TINKER_API_KEY)"
                ) from None
            raise
        except tinker.TinkerError as exc:
            if isinstance(exc, tinker.APIError):
                raise
            raise UsageError(f"tinker: {exc}") from None

    def _open_bounded(self) -> Any:
        """:meth:`_open` in a daemon thread, given ``timeout`` seconds (the SDK's own retries while the session
        opens take minutes, and a thread still inside them must not hold the process at exit)."""
        opened: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                opened.set_result(self._open())
            except BaseException as exc:  # handed to the caller
                opened.set_exception(exc)

        threading.Thread(target=run, name="prl-score-tinker-open", daemon=True).start()
        try:
            return opened.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            problem = f"no sampling session after {self.timeout:g}s"
        except self.tinker.APIError as exc:
            problem = f"{type(exc).__name__} opening a sampling session"
        self._give_up(problem)

    def _wait_or_give_up(self, attempt: int, problem: str) -> None:
        """Sleep before retry ``attempt + 1``, or give up when the retries are spent."""
        if attempt >= self.retry.retries:
            self._give_up(f"{problem} after {attempt + 1} attempts")
        delay = self.retry.delay(attempt, None)
        log.info("%s: %s; retrying in %.1fs", self.source, problem, delay)
        time.sleep(delay)

    def _give_up(self, problem: str) -> NoReturn:
        """Mark the service down (the requests still queued stop without trying) and raise."""
        with self._lock:
            if not self._down.is_set():
                self._down_reason = (
                    f"{self.source} is unavailable: {problem}; committed batches are kept, rerun to score the rest"
                )
                self._down.set()
        self._failed = True
        raise RetryableIOError(self._down_reason)

    def close(self) -> None:
        """Drop queued requests and finish the session (waiting at most ``CLOSE_SECONDS``)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        service, self._service, self.sampler = self._service, None, None
        if service is None:
            return
        try:
            service.close("errored" if self._failed else "success").result(timeout=min(self.timeout, CLOSE_SECONDS))
        except Exception as exc:  # the session ends on the service's side when heartbeats stop
            log.info("%s: finishing the session: %s", self.source, type(exc).__name__)

    # --- scoring ---------------------------------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[Outcome]:
        return answer_empty(requests, self._map)

    def _map(self, requests: list[ScoreRequest]) -> list[Outcome]:
        """One ``compute_logprobs`` per request, ``concurrency`` in flight; outcomes in request order."""
        futures = [self._pool.submit(self._one, r) for r in requests]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def _one(self, request: ScoreRequest) -> Outcome:
        attempt = 0
        while True:
            if self._down.is_set():
                raise RetryableIOError(self._down_reason)
            outcome, problem = self._attempt(request)
            if outcome is not None:
                return outcome
            self._wait_or_give_up(attempt, problem)
            attempt += 1

    def _attempt(self, request: ScoreRequest) -> tuple[Outcome | None, str]:
        """One ``compute_logprobs``: its outcome, or (None, what went wrong) when it is worth retrying."""
        tinker = self.tinker
        prompt = tinker.types.ModelInput.from_ints(request.input_ids)
        pending = self.sampler.compute_logprobs(prompt, prompt_logprobs_last_n=len(request.completion_ids))
        try:
            return check_answer(pending.result(timeout=self.timeout), request), ""
        except concurrent.futures.TimeoutError:
            pending.future().cancel()
            return None, f"no answer in {self.timeout:g}s"
        except tinker.RequestFailedError as exc:
            if exc.category == tinker.types.RequestErrorCategory.User:
                return Quarantined("endpoint_rejected", f"request failed: {exc.message}"), ""
            return None, f"request failed ({exc.category}): {exc.message}"
        except tinker.APIStatusError as exc:
            return self._status(exc.status_code, exc.message)
        except tinker.APIConnectionError as exc:
            return None, type(exc).__name__
        except ValueError as exc:  # the SDK's retrieve_future loop: a final HTTP error, or an unreadable answer
            cause = exc.__cause__
            if isinstance(cause, tinker.APIStatusError):
                return self._status(cause.status_code, cause.message)
            return Quarantined("bad_response", str(exc)[:300]), ""
        except RuntimeError as exc:  # the SDK's check that only the asked suffix was scored
            if "prompt_logprobs_last_n" in str(exc):
                return Quarantined("misaligned", str(exc)), ""
            raise

    def _status(self, status: int, message: str) -> tuple[Outcome | None, str]:
        if status in CONFIG_STATUS:
            raise UsageError(
                f"{self.source} answered HTTP {status}: {message} (check --endpoint, --served-model and TINKER_API_KEY)"
            )
        if status in RETRY_STATUS:
            return None, f"HTTP {status}"
        return Quarantined("endpoint_rejected", f"HTTP {status}: {message}"), ""
