"""Reference logprobs from a local transformers model folder (``AutoModelForCausalLM``; the ``prl[ref]`` extra).

The folder is loaded with ``trust_remote_code=False`` and ``local_files_only=True``: only architectures that
transformers itself implements, nothing fetched from a hub. On a CUDA device the weights are bfloat16, on CPU
float32; log-softmax is always taken in float32.

Batches are packed by length: requests are sorted longest first and cut into micro-batches whose padded size
``rows × longest`` stays within ``batch_tokens``, so the activations of one forward pass are bounded by it; the
logits, kept only at completion positions, are bounded to ``LOGITS_BYTES`` (rows × longest completion ×
vocabulary × 4 bytes). Rows
are left-padded with explicit position IDs, so every row sees exactly what an unpadded forward pass would.

A request that cannot be scored is quarantined: ``empty_prompt`` (as by every backend), ``token_out_of_vocab``, ``too_long`` (longer than the model's positions), ``exceeds_batch_tokens`` (longer than
``batch_tokens`` alone).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from prl.errors import UsageError
from prl.formats.base import Quarantined
from prl.score.base import Outcome, ScoreRequest, answer_empty, completion_logprobs

LOGITS_BYTES = 1 << 30
"""Float32 logits one forward pass may keep (rows × longest completion × vocabulary × 4 bytes)."""


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise UsageError("--model needs torch: pip install 'prl[ref]'") from exc
    return torch


def pack(
    lengths: Sequence[int], batch_tokens: int, completions: Sequence[int] | None = None, max_positions: int = 0
) -> list[list[int]]:
    """Indices into ``lengths`` grouped into micro-batches, longest first, each with ``rows × longest ≤
    batch_tokens`` and, when ``completions`` and ``max_positions`` are given, ``rows × longest completion ≤
    max_positions`` (the logits kept). A single request above a bound is the caller's to refuse."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    widest = 0
    for index in order:
        width = completions[index] if completions is not None else 0
        if batches:
            rows, longest, kept = len(batches[-1]) + 1, lengths[batches[-1][0]], max(widest, width)
            if rows * longest <= batch_tokens and (not max_positions or rows * kept <= max_positions):
                batches[-1].append(index)
                widest = kept
                continue
        batches.append([index])
        widest = width
    return batches


class LocalBackend:
    """Scores requests with a causal LM in this process (see the module doc)."""

    name = "local"

    def __init__(self, path: str, *, batch_tokens: int = 8192, device: str | None = None) -> None:
        if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "config.json")):
            raise UsageError(f"--model {path}: expected a local transformers model folder with config.json")
        torch = _torch()
        import transformers
        from transformers import AutoModelForCausalLM

        transformers.utils.logging.disable_progress_bar()  # stderr stays for prl's own log lines

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
        dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # renamed in transformers 4.56
        model: Any
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path, trust_remote_code=False, local_files_only=True, **{dtype_key: self.dtype}
            )
        except (OSError, ValueError) as exc:
            raise UsageError(f"--model {path}: cannot load it with transformers: {exc}") from exc
        self.model: Any = model.to(self.device).eval()
        self.source = os.path.abspath(path)
        self.batch_tokens = batch_tokens
        config = model.config
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.pad_id = 0

    def close(self) -> None:
        self.model = None

    def score(self, requests: Sequence[ScoreRequest]) -> list[Outcome]:
        return answer_empty(requests, self._score_nonempty)

    def _score_nonempty(self, requests: list[ScoreRequest]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [self._refusal(r) for r in requests]
        ready = [i for i, o in enumerate(outcomes) if o is None]
        lengths = [requests[i].tokens for i in ready]
        completions = [len(requests[i].completion_ids) + 1 for i in ready]
        for group in pack(lengths, self.batch_tokens, completions, LOGITS_BYTES // (4 * self.vocab_size)):
            rows = [ready[g] for g in group]
            for index, values in zip(rows, self._forward([requests[i] for i in rows])):
                outcomes[index] = completion_logprobs(values, requests[index])
        return [o for o in outcomes if o is not None]

    def _refusal(self, request: ScoreRequest) -> Quarantined | None:
        ids = np.concatenate([request.prompt_ids, request.completion_ids])
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            return Quarantined("token_out_of_vocab", f"token {bad} is outside the model's {self.vocab_size} rows")
        if self.max_positions and request.tokens > self.max_positions:
            return Quarantined("too_long", f"{request.tokens} tokens; the model has {self.max_positions} positions")
        if request.tokens > self.batch_tokens:
            return Quarantined(
                "exceeds_batch_tokens", f"{request.tokens} tokens alone exceed --batch-tokens {self.batch_tokens}"
            )
        return None

    def _forward(self, requests: list[ScoreRequest]) -> list[np.ndarray]:
        """One left-padded forward pass; float64 logprobs ``[C_i]`` per request."""
        torch = self.torch
        width = max(r.tokens for r in requests)
        keep = max(len(r.completion_ids) for r in requests) + 1
        ids = np.full((len(requests), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(requests), width), dtype=np.int64)
        for row, request in enumerate(requests):
            ids[row, width - request.tokens :] = np.concatenate([request.prompt_ids, request.completion_ids])
            mask[row, width - request.tokens :] = 1
        input_ids = torch.from_numpy(ids).to(self.device)
        attention = torch.from_numpy(mask).to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = self.model(
                input_ids=input_ids, attention_mask=attention, position_ids=positions, logits_to_keep=keep
            ).logits
            out = []
            for row, request in enumerate(requests):
                count = len(request.completion_ids)
                rows = logits[row, keep - 1 - count : keep - 1].float()
                target = input_ids[row, width - count :].unsqueeze(-1)
                values = rows.gather(-1, target).squeeze(-1) - torch.logsumexp(rows, dim=-1)
                out.append(values.double().cpu().numpy())
        return out
