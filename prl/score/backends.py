"""Which backend a score-ref run scores with, and opening it: in the driver, or in each worker of another engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prl.errors import UsageError
from prl.score.base import Backend

ENDPOINT_BACKENDS = ("vllm", "sglang", "tinker")


def backend_kind(endpoint: str | None, backend: str) -> str:
    """``local`` without an endpoint; with one, ``backend`` or for ``auto`` the URL's kind (``…/generate`` is
    SGLang, anything else vLLM). Raises :class:`UsageError` for a backend that does not fit."""
    if endpoint is None:
        if backend not in ("auto", "local"):
            raise UsageError(f"--backend {backend} needs --endpoint; --model PATH is the local backend")
        return "local"
    if backend == "auto":
        return "sglang" if endpoint.rstrip("/").endswith("/generate") else "vllm"
    if backend not in ENDPOINT_BACKENDS:
        raise UsageError(f"--backend must be auto, vllm, sglang or tinker with --endpoint, not {backend!r}")
    return backend


@dataclass(frozen=True)
class BackendSpec:
    """Everything needed to open a run's backend (:func:`backend_kind` decided ``kind``); credentials are never
    part of it (each process reads its own environment)."""

    kind: str
    endpoint: str | None
    model: str | None
    served_model: str | None
    batch_tokens: int
    concurrency: int
    retries: int
    timeout: float

    def open(self) -> Backend:
        """The backend, loaded (a local model) or connected (an endpoint client)."""
        if self.kind == "local":
            from prl.score.local import LocalBackend

            assert self.model is not None
            return LocalBackend(self.model, batch_tokens=self.batch_tokens)
        from prl.score.http import RetryPolicy

        assert self.endpoint is not None
        client: dict[str, Any] = {
            "concurrency": self.concurrency,
            "timeout": self.timeout,
            "retry": RetryPolicy(retries=self.retries),
        }
        if self.kind == "sglang":
            from prl.score.sglang import SglangBackend

            return SglangBackend(self.endpoint, **client)
        if self.kind == "tinker":
            from prl.score.tinker import TinkerBackend

            return TinkerBackend(self.endpoint, served_model=self.served_model, **client)
        from prl.score.vllm import VllmBackend

        return VllmBackend(self.endpoint, served_model=self.served_model, **client)


__all__ = ["ENDPOINT_BACKENDS", "BackendSpec", "backend_kind"]
