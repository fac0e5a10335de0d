"""Reference logprobs from an SGLang server's native ``POST /generate`` with the token IDs as input.

Request (SGLang ``GenerateReqInput``, ``python/sglang/srt/managers/io_struct.py``): ``input_ids`` = prompt +
completion token IDs, ``return_logprob`` true, ``logprob_start_len`` = the prompt length (logprobs from the first
completion token on), ``top_logprobs_num`` 0, ``sampling_params.max_new_tokens`` 0 (prefill only).

Answer: ``meta_info.input_token_logprobs``, one ``[logprob, token_id, text]`` triple per input position from
``logprob_start_len`` on (``len + logprob_start_len == meta_info.prompt_tokens``, as SGLang's
``test/srt/test_srt_endpoint.py`` asserts); the logprob is that position's token given everything before it.
A list of another length, or a triple naming another token, is quarantined (``length_mismatch``,
``misaligned``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prl.formats.base import Quarantined
from prl.score.base import Outcome, ScoreRequest, answer_empty, completion_logprobs, misaligned
from prl.score.http import EndpointClient


def endpoint_url(url: str) -> str:
    """``http://host:port`` → ``…/generate``; a URL already ending in ``/generate`` is kept."""
    base = url.rstrip("/")
    return base if base.endswith("/generate") else base + "/generate"


def payload(request: ScoreRequest) -> dict[str, Any]:
    """The JSON body scoring ``request``."""
    return {
        "input_ids": request.input_ids,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": len(request.prompt_ids),
        "top_logprobs_num": 0,
    }


def parse(answer: Any, request: ScoreRequest) -> Outcome:
    """Completion-aligned logprobs from a ``/generate`` answer to :func:`payload` (see the module doc)."""
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    triples = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(triples, list):
        return Quarantined("bad_response", "answer has no meta_info.input_token_logprobs (is this an SGLang server?)")
    expected = len(request.completion_ids)
    if len(triples) != expected:
        return Quarantined("length_mismatch", f"{len(triples)} input_token_logprobs for {expected} completion tokens")
    values: list[float | None] = []
    for position, triple in enumerate(triples):
        if not isinstance(triple, (list, tuple)) or len(triple) < 2:
            return Quarantined("bad_response", f"input_token_logprobs[{position}] is {triple!r}")
        value, token = triple[0], triple[1]
        if token != int(request.completion_ids[position]):
            return misaligned(request, position, token)
        values.append(value if isinstance(value, (int, float)) and not isinstance(value, bool) else None)
    return completion_logprobs(values, request)


class SglangBackend:
    """Scores requests against an SGLang server (see the module doc)."""

    name = "sglang"

    def __init__(self, url: str, **client: Any) -> None:
        self.client = EndpointClient(endpoint_url(url), **client)
        self.source = self.client.source

    def score(self, requests: Sequence[ScoreRequest]) -> list[Outcome]:
        return answer_empty(requests, lambda todo: self.client.map(todo, payload, parse))

    def close(self) -> None:
        self.client.close()
