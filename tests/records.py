"""Builders of wire records in the exact shapes servers emit, for tests."""

from __future__ import annotations

from typing import Any


def chat_logprob_entries(
    ids: list[int], logprobs: list[float | None], heads: list[list[tuple[int, float]]] | None = None
) -> list[dict[str, Any]]:
    """vLLM chat ``logprobs.content`` with ``return_tokens_as_token_ids`` tokens."""
    out = []
    for i, (tid, lp) in enumerate(zip(ids, logprobs)):
        head = heads[i] if heads is not None else []
        out.append(
            {
                "token": f"token_id:{tid}",
                "logprob": lp,
                "bytes": [65],
                "top_logprobs": [{"token": f"token_id:{h}", "logprob": hl, "bytes": [66]} for h, hl in head],
            }
        )
    return out


def vllm_chat(
    request_id: str,
    prompt: list[int],
    completions: list[tuple[list[int], list[float | None]]],
    *,
    heads: list[list[list[tuple[int, float]]]] | None = None,
    finish_reason: str = "stop",
    with_token_ids: bool = True,
    metadata: dict[str, Any] | None = None,
    created: int = 1764460800,
) -> dict[str, Any]:
    """A vLLM ``/v1/chat/completions`` response with ``return_token_ids`` and logprobs."""
    choices = []
    for index, (ids, lps) in enumerate(completions):
        choice: dict[str, Any] = {
            "index": index,
            "message": {"role": "assistant", "content": "text", "tool_calls": []},
            "logprobs": {"content": chat_logprob_entries(ids, lps, heads[index] if heads else None)},
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        if with_token_ids:
            choice["token_ids"] = ids
        choices.append(choice)
    record: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": "deepseek-v4",
        "choices": choices,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": sum(len(c[0]) for c in completions)},
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
    }
    if metadata is not None:
        record["metadata"] = metadata
    return record


def vllm_completion(
    request_id: str,
    prompt: list[int],
    ids: list[int],
    logprobs: list[float | None],
    heads: list[dict[str, float]] | None = None,
) -> dict[str, Any]:
    """A vLLM ``/v1/completions`` response (``return_token_ids``, ``"token_id:N"`` tokens, dict heads)."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": 1764460800,
        "model": "deepseek-v4",
        "choices": [
            {
                "index": 0,
                "text": "text",
                "logprobs": {
                    "text_offset": list(range(len(ids))),
                    "token_logprobs": logprobs,
                    "tokens": [f"token_id:{t}" for t in ids],
                    "top_logprobs": heads,
                },
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_token_ids": prompt,
                "token_ids": ids,
            }
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
    }


def sglang_generate(
    rid: str,
    input_ids: list[int],
    ids: list[int],
    logprobs: list[float],
    *,
    heads: list[list[tuple[float, int]]] | None = None,
    weight_version: str | None = "7",
    weight_versions: list[Any] | None = None,
    finish: str = "stop",
) -> dict[str, Any]:
    """An SGLang native ``/generate`` response with ``return_logprob``."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": {"type": finish, "matched": 1} if finish == "stop" else {"type": finish, "length": len(ids)},
        "prompt_tokens": len(input_ids),
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids)],
        "e2e_latency": 0.1,
    }
    if heads is not None:
        meta["output_top_logprobs"] = [[[lp, t, None] for lp, t in head] for head in heads]
    if weight_version is not None:
        meta["weight_version"] = weight_version
    if weight_versions is not None:
        meta["weight_versions"] = weight_versions
    return {"text": "text", "output_ids": ids, "meta_info": meta, "input_ids": input_ids}
