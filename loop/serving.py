"""The serving side of the loop: a genuine vLLM server, the logging proxy in front of it, and the refit.

- :func:`start_policy_server` runs ``vllm.entrypoints.openai.api_server`` from the engines' virtualenv
  (``tests.genuine_engines``) with ``VLLM_SERVER_DEV_MODE=1``, which adds the weight routes an RL deployment
  uses: ``/pause``, ``/collective_rpc``, ``/update_weight_version``, ``/resume``, ``/weight_info``.
- :class:`CaptureProxy` (the tests' :class:`~tests.genuine_engines.LoggingProxy`, gated) is the logging proxy a
  production deployment puts in front of its servers: it forwards each request, names the weights it routed to
  in an ``x-policy-version`` header, and appends one proxy capture per call (``{timestamp, request, response}``,
  the shape prl's ``proxy_capture`` format reads) to a live file that :meth:`CaptureProxy.rotate` closes and
  moves into the folder prl ingests, as a log shipper would.
- :meth:`CaptureProxy.refit` loads new weights without a restart: it holds new requests and waits for those in
  flight (so every capture's header names the weights that answered it), then ``/pause?mode=wait``,
  ``/collective_rpc`` ``reload_weights`` with the new folder (vLLM's in-place reload from a checkpoint folder),
  ``/update_weight_version`` and ``/resume``.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from tests.genuine_engines import LoggingProxy, Server, start_vllm

SERVED_NAME = "policy"
VERSION_HEADER = "x-policy-version"


def start_policy_server(model_dir: Path, log: Path, timeout: float = 900.0) -> Server:
    """vLLM serving ``model_dir`` as ``policy`` (float32, so the trainer's logprobs and the sampler's differ only
    by kernels), with the dev-mode weight routes."""
    return start_vllm(
        model_dir, log, timeout, name=SERVED_NAME, dtype="float32", env_extra={"VLLM_SERVER_DEV_MODE": "1"}
    )


def call(url: str, body: dict[str, Any] | None = None, timeout: float = 300.0) -> dict[str, Any]:
    """POST ``body`` (GET when None) and the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return dict(json.loads(answer.read()))


class CaptureProxy(LoggingProxy):
    """The logging proxy (see the module docstring). ``live`` is the file being written; :meth:`rotate` moves it
    into ``shipped`` under a new name."""

    def __init__(self, upstream: str, live: Path, shipped: Path, version: str) -> None:
        super().__init__(upstream, live)
        self.shipped, self.version = shipped, version
        self.answered: Counter[str] = Counter()
        """Calls answered per policy version."""
        self._state = threading.Condition()
        self._in_flight = 0
        self._held = False
        self._rotations = 0
        live.parent.mkdir(parents=True, exist_ok=True)
        shipped.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> CaptureProxy:
        super().__enter__()
        return self

    def call_headers(self) -> dict[str, str]:
        """The version header of the weights now served; waits while a refit holds calls."""
        with self._state:
            self._state.wait_for(lambda: not self._held)
            self._in_flight += 1
            return {VERSION_HEADER: self.version}

    def call_done(self, headers: dict[str, str]) -> None:
        with self._state:
            self._in_flight -= 1
            self.answered[headers[VERSION_HEADER]] += 1
            self._state.notify_all()

    def rotate(self) -> Path | None:
        """Close the live file and move it into ``shipped`` (a rename: prl never sees a half-written file); the
        path it got, or None when nothing was written since the last rotation."""
        with self.write_lock:
            if not self.log.exists() or self.log.stat().st_size == 0:
                return None
            self._rotations += 1
            target = self.shipped / f"capture-{int(time.time())}-{self._rotations:04d}.jsonl"
            os.replace(self.log, target)
            return target

    def refit(self, weights: Path, version: str) -> float:
        """Load ``weights`` into the server in place and name them ``version``; the seconds it held traffic."""
        with self._state:
            self._held = True
            self._state.wait_for(lambda: self._in_flight == 0)
        started = time.monotonic()
        loaded = False
        try:
            call(self.upstream + "/pause?mode=wait", {})
            call(
                self.upstream + "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}},
            )
            call(self.upstream + "/update_weight_version", {"new_version": version})
            call(self.upstream + "/resume", {})
            served = call(self.upstream + "/weight_info")["weight_version"]
            if served != version:
                raise RuntimeError(f"the server reports weights {served!r} after loading {version!r}")
            loaded = True
        finally:
            with self._state:
                if loaded:
                    self.version = version
                self._held = False
                self._state.notify_all()
        return time.monotonic() - started


__all__ = ["SERVED_NAME", "VERSION_HEADER", "CaptureProxy", "call", "start_policy_server"]
