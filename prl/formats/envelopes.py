"""Envelopes: records that wrap a response in something else. Each is unwrapped, its body dispatched to the
format that recognises it (:func:`prl.formats.registry.detect_record`), and the request side fills in what
the response does not say:

* OpenAI / vLLM batch output (``vllm run-batch``, OpenAI Batch API)::

      {"id": "...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...", "body": {...}},
       "error": null}

  ``error`` set, or a ``status_code`` other than 200, is ``upstream_error``. vLLM's first ``run_batch``
  (0.4.x, before ``BatchResponseData``) wrote the completion itself as ``response`` (no ``status_code`` /
  ``body``): read the same way.
* proxy captures ``{"request": {...}, "response": {...}}``: either side may be the body itself or an HTTP
  record ``{"body": ..., "status_code": ...}``; a streamed response body (SSE text or a list of chunks) is
  joined like an SSE capture. Timestamps from ``timestamp``/``created_at``/``start_time`` on the envelope or
  the request. The policy version from an ``x-policy-version`` / ``x-weight-version`` header (a routing proxy
  naming the weights it sent the request to) where the response names none.
* LiteLLM logging payloads (``StandardLoggingPayload``, alone or under ``standard_logging_object``):
  ``messages``, ``response``, ``model_parameters``, ``startTime``, ``metadata``, ``end_user``, ``status``.

From the request side: prompt IDs (``prompt_token_ids``/``input_ids``/``token_ids``/list ``prompt``; also
injected into a body that lacks them, so the inner reader sees a prompt), ``messages`` (compact JSON),
session (``session_id``, ``metadata.session_id``, else ``user``), temperature, top-p, top-k, logprobs mode
and the creation time. Response-side values win where both exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from prl.formats.base import Format, ParseOptions, Quarantined, Sample
from prl.formats.fields import RequestSide, as_dict, opt_dict, opt_str, request_side, timestamp_us
from prl.formats.sse.exact import frame_decoded, is_chunk, parse_chunks


def dispatch(
    body: Any, side: RequestSide | None, options: ParseOptions, inner: Sequence[Format]
) -> list[Sample | Quarantined]:
    """Parse an unwrapped response ``body`` with the first of the ``inner`` formats that detects it and fill in
    ``side``; a streamed body (SSE text or a list of chunks) is read as a stream."""
    if isinstance(body, str):
        if "data:" not in body:
            raise Quarantined("no_token_ids", "the response body is text only; text is never retokenized")
        records = list(frame_decoded(enumerate(body.encode().splitlines(), start=1)))
        streams = [r for r in records if r.error is None and isinstance(r.obj, dict)]
        if not streams:
            raise Quarantined("malformed_sse", "the response body holds no SSE stream")
        body = streams[0].obj
    if isinstance(body, list) and body and is_chunk(body[0]):
        samples = parse_chunks(body, options)
    else:
        body = as_dict(body, "response body")
        if side is not None and side.prompt_token_ids is not None:
            ids = side.prompt_token_ids.to_pylist()
            if body.get("prompt_token_ids") is None:
                body = {**body, "prompt_token_ids": ids}
            if body.get("input_ids") is None and "meta_info" in body:
                body = {**body, "input_ids": ids}
        fmt = next((f for f in inner if not isinstance(f, _Envelope) and f.detect(body)), None)
        if fmt is None:
            raise Quarantined("unknown_format", "no known format matches the response body")
        samples = fmt.parse(body, options)
    if side is not None:
        for item in samples:
            if isinstance(item, Sample):
                side.fill(item)
    return samples


def _http_body(side: Any) -> tuple[Any, int | None]:
    """(body, status) of a captured HTTP message, or the message itself when it is already a body."""
    if (
        isinstance(side, dict)
        and "body" in side
        and ("status_code" in side or "status" in side or "headers" in side or len(side) <= 3)
    ):
        status = side.get("status_code", side.get("status"))
        return side["body"], status if type(status) is int else None
    return side, None


class _Envelope(Format):
    """An envelope unwraps a record and hands its body to one of ``inner``, the formats a body may be in (the
    registry passes its non-envelope formats, in detection order); envelopes never dispatch to envelopes."""

    def __init__(self, inner: Sequence[Format] = ()) -> None:
        self.inner = tuple(inner)


class OpenAIBatch(_Envelope):
    """OpenAI Batch API / ``vllm run-batch`` output lines."""

    name: ClassVar[str] = "openai_batch"
    description: ClassVar[str] = "OpenAI/vLLM batch output: custom_id + response.body"

    def detect(self, obj: Any) -> bool:
        return isinstance(obj, dict) and "custom_id" in obj and ("response" in obj or "error" in obj)

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        if obj.get("error") is not None:
            raise Quarantined("upstream_error", f"batch request failed: {str(obj['error'])[:300]}")
        response = as_dict(obj.get("response"), "response")
        if "body" not in response and "status_code" not in response and "choices" in response:
            return dispatch(
                response, None, options, self.inner
            )  # vLLM 0.4 run-batch: the response is the completion itself
        status = response.get("status_code")
        if status != 200:
            raise Quarantined("upstream_error", f"batch response status_code {status!r}")
        return dispatch(response.get("body"), None, options, self.inner)


class ProxyCapture(_Envelope):
    """``{"request": ..., "response": ...}`` records written by logging proxies."""

    name: ClassVar[str] = "proxy_capture"
    description: ClassVar[str] = "proxy captures: {request, response}"

    def detect(self, obj: Any) -> bool:
        return isinstance(obj, dict) and isinstance(obj.get("request"), dict) and "response" in obj

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        request, _ = _http_body(obj.get("request"))
        request = as_dict(request, "request body")
        if obj.get("error") is not None:
            raise Quarantined("upstream_error", f"the proxied request failed: {str(obj['error'])[:300]}")
        body, status = _http_body(obj.get("response"))
        if status is not None and status != 200:
            raise Quarantined("upstream_error", f"response status {status}")
        created = next(
            (
                obj[key] if key in obj else request[key]
                for key in ("timestamp", "created_at", "start_time", "startTime", "request_time")
                if key in obj or key in request
            ),
            None,
        )
        side = request_side(request, created)
        if side.created_at_us is None:
            side.created_at_us = timestamp_us(created)
        side.session_id = side.session_id or opt_str(obj.get("session_id"))
        version = header_version(obj)
        if version is not None:  # the proxy's word beats --policy-version; a version in the response beats both
            options = replace(options, policy_version=version)
        return dispatch(body, side, options, self.inner)


VERSION_HEADERS = ("x-policy-version", "x-weight-version")
"""Headers a routing proxy sets to name the policy version it sent the request to (any case)."""


def header_version(obj: dict[str, Any]) -> str | None:
    """The policy version named by a proxy capture's headers: on the record, its request or its response (a dict,
    or a list of ``[name, value]`` pairs); None when none names one."""
    request, response = obj.get("request"), obj.get("response")
    places = [obj.get("headers"), obj.get("request_headers")]
    places += [side.get("headers") for side in (request, response) if isinstance(side, dict)]
    for headers in places:
        if isinstance(headers, list):
            headers = {str(p[0]): p[1] for p in headers if isinstance(p, list | tuple) and len(p) == 2}
        if isinstance(headers, dict):
            lowered = {str(k).lower(): v for k, v in headers.items()}
            for name in VERSION_HEADERS:
                value = lowered.get(name)
                if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
                    return str(value)
    return None


class LiteLLMLog(_Envelope):
    """LiteLLM ``StandardLoggingPayload`` records (logging callbacks, S3/GCS loggers)."""

    name: ClassVar[str] = "litellm_log"
    description: ClassVar[str] = "LiteLLM logging payloads: messages + response + model_parameters"

    @staticmethod
    def _payload(obj: Any) -> dict[str, Any] | None:
        if not isinstance(obj, dict):
            return None
        if isinstance(obj.get("standard_logging_object"), dict):
            return obj["standard_logging_object"]
        if "response" in obj and ("model_parameters" in obj or "call_type" in obj):
            return obj
        return None

    def detect(self, obj: Any) -> bool:
        return self._payload(obj) is not None

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        payload = self._payload(obj)
        if payload is None:
            raise Quarantined("bad_shape", "not a LiteLLM logging payload")
        if payload.get("status") == "failure" or payload.get("error_str"):
            raise Quarantined("upstream_error", f"LiteLLM logged a failure: {str(payload.get('error_str'))[:300]}")
        metadata = opt_dict(payload.get("metadata"))
        request = {
            **opt_dict(payload.get("model_parameters")),
            "messages": payload.get("messages"),
            "model": payload.get("model"),
            "metadata": {**opt_dict(metadata.get("requester_metadata")), **metadata},
            "user": payload.get("end_user") or None,
        }
        if isinstance(payload.get("messages"), str):
            request["messages"] = [{"role": "user", "content": payload["messages"]}]
        side = request_side(request, payload.get("startTime"))
        return dispatch(payload.get("response"), side, options, self.inner)
