"""Reference logprobs from a vLLM server: ``POST /v1/completions`` with the token IDs as the prompt.

Request (vLLM ``CompletionRequest``, ``vllm/entrypoints/openai/completion/protocol.py``): ``prompt`` = prompt +
completion token IDs (a list of ints is taken as tokens, never retokenized, no BOS added), ``max_tokens`` 1 (the
one sampled token is ignored), ``prompt_logprobs`` 0 (the logprob of each prompt token itself, no alternatives),
``temperature`` 0; ``model`` when a served model name is given.

Answer: ``choices[0].prompt_logprobs``, one entry per input token; the first is null (nothing precedes it), every
other a dict ``{"<token id>": {"logprob", "rank", "decoded_token"}}`` holding at least that position's own token.
The entries at the completion positions are the reference logprobs. An answer whose list is not exactly as long
as the input, or whose entry lacks the sample's token, is quarantined (``length_mismatch``, ``misaligned``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prl.formats.base import Quarantined
from prl.score.base import Outcome, ScoreRequest, answer_empty, completion_logprobs, misaligned
from prl.score.http import EndpointClient

PATH = "/v1/completions"


def endpoint_url(url: str) -> str:
    """``http://host:port`` or ``…/v1`` → ``…/v1/completions``; a URL already ending in ``/completions`` is kept."""
    base = url.rstrip("/")
    if base.endswith("/completions"):
        return base
    return base + ("/completions" if base.endswith("/v1") else PATH)


def payload(request: ScoreRequest, served_model: str | None = None) -> dict[str, Any]:
    """The JSON body scoring ``request``."""
    body: dict[str, Any] = {
        "prompt": request.input_ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }
    if served_model:
        body["model"] = served_model
    return body


def parse(answer: Any, request: ScoreRequest) -> Outcome:
    """Completion-aligned logprobs from a ``/v1/completions`` answer to :func:`payload` (see the module doc)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Quarantined("bad_response", "answer has no choices")
    entries = choices[0].get("prompt_logprobs")
    if not isinstance(entries, list):
        return Quarantined("bad_response", "choices[0] has no prompt_logprobs list (is this a vLLM server?)")
    total, start = request.tokens, len(request.prompt_ids)
    if len(entries) != total:
        return Quarantined("length_mismatch", f"{len(entries)} prompt_logprobs entries for {total} input tokens")
    values: list[float | None] = []
    for position, entry in enumerate(entries[start:]):
        token = str(int(request.completion_ids[position]))
        if not isinstance(entry, dict):
            return Quarantined("bad_response", f"prompt_logprobs entry at completion position {position} is {entry!r}")
        item = entry.get(token)
        if not isinstance(item, dict):
            return misaligned(request, position, sorted(entry)[:3])
        value = item.get("logprob")
        values.append(value if isinstance(value, (int, float)) and not isinstance(value, bool) else None)
    return completion_logprobs(values, request)


class VllmBackend:
    """Scores requests against a vLLM OpenAI-compatible server (see the module doc)."""

    name = "vllm"

    def __init__(self, url: str, *, served_model: str | None = None, **client: Any) -> None:
        self.client = EndpointClient(endpoint_url(url), **client)
        self.source = self.client.source
        self.served_model = served_model

    def score(self, requests: Sequence[ScoreRequest]) -> list[Outcome]:
        return answer_empty(requests, lambda todo: self.client.map(todo, self._payload, parse))

    def _payload(self, request: ScoreRequest) -> dict[str, Any]:
        return payload(request, self.served_model)

    def close(self) -> None:
        self.client.close()
