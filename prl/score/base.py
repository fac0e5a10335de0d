"""What every scoring backend takes and gives back, and the one validation every answer passes.

A backend gets :class:`ScoreRequest` s (a sample's prompt and completion token IDs) and answers, per request,
either the completion-aligned reference logprobs (float32, one per completion token) or a :class:`Quarantined`
with a reason. :func:`completion_logprobs` is the gate between an answer and the store: an answer of the wrong
length, or with a non-finite or positive value, never becomes a ``ref_logprobs`` row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from prl.formats.base import Quarantined

VLLM_FLOOR = -9999.0
"""vLLM writes ``-inf`` logprobs as this number in JSON; a reference logprob of -9999 is no real value."""

Outcome = np.ndarray | Quarantined
"""A request's answer: float32 logprobs of shape ``[completion_len]``, or why there are none."""


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """One sample to score: ``prompt_ids`` ``[P]`` and ``completion_ids`` ``[C]`` (int32), sent as they are."""

    sample_id: str
    prompt_ids: np.ndarray
    completion_ids: np.ndarray

    @property
    def tokens(self) -> int:
        """Prompt + completion length: what the reference model reads."""
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def input_ids(self) -> list[int]:
        """Prompt + completion token IDs as a JSON-able list."""
        return [*self.prompt_ids.tolist(), *self.completion_ids.tolist()]


class Backend(Protocol):
    """A reference model. ``score`` answers one :data:`Outcome` per request, in request order; it raises
    :class:`prl.errors.RetryableIOError` when the model cannot be reached, never quarantines for that."""

    name: str
    """Short backend name recorded in quarantine rows (``vllm``, ``sglang``, ``tinker``, ``local``)."""
    source: str
    """Where the logprobs come from (an endpoint URL without credentials, or a model folder): the rows'
    ``source_uri``."""

    def score(self, requests: Sequence[ScoreRequest]) -> list[Outcome]: ...

    def close(self) -> None: ...


def completion_logprobs(values: Sequence[float | None] | np.ndarray, request: ScoreRequest) -> Outcome:
    """Validate a backend's completion-aligned logprobs for ``request``: exactly one finite value ≤ 0 per
    completion token (a ``None`` or vLLM's ``-9999.0`` floor counts as non-finite). Returns float32 ``[C]`` or a
    :class:`Quarantined` with reason ``length_mismatch``, ``nonfinite_logprob`` or ``positive_logprob``."""
    expected = len(request.completion_ids)
    if len(values) != expected:
        return Quarantined("length_mismatch", f"{len(values)} reference logprobs for {expected} completion tokens")
    if isinstance(values, np.ndarray):
        array = values.astype(np.float64)
    else:
        array = np.array([np.nan if v is None else v for v in values], dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(array) | (array <= VLLM_FLOOR)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        return Quarantined("nonfinite_logprob", f"reference logprob at completion position {at} is {values[at]}")
    if (array > 0).any():
        at = int(np.flatnonzero(array > 0)[0])
        return Quarantined("positive_logprob", f"reference logprob at completion position {at} is {array[at]}")
    return array.astype(np.float32)


def misaligned(request: ScoreRequest, position: int, got: object) -> Quarantined:
    """The answer names another token than the sample's at a completion ``position``."""
    want = int(request.completion_ids[position])
    return Quarantined(
        "misaligned", f"answer at completion position {position} is for token {got!r}, the sample has {want}"
    )


def answer_empty(
    requests: Sequence[ScoreRequest], send: Callable[[list[ScoreRequest]], list[Outcome]]
) -> list[Outcome]:
    """Answer what needs no model: an empty completion (nothing to score) and an empty prompt (nothing precedes
    the first completion token: ``empty_prompt``); ``send`` the rest. Outcomes come back in request order."""

    def local(request: ScoreRequest) -> Outcome | None:
        if not len(request.completion_ids):
            return np.zeros(0, np.float32)
        if not len(request.prompt_ids):
            return Quarantined("empty_prompt", "no prompt token precedes the first completion token")
        return None

    answered = [local(r) for r in requests]
    todo = [r for r, a in zip(requests, answered) if a is None]
    sent = iter(send(todo) if todo else [])
    return [next(sent) if a is None else a for a in answered]
