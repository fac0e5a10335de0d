"""Text-only OpenAI records: chat completions without any token IDs, Responses API objects, and chat
``messages`` records (fine-tuning style). They carry text and no IDs, and prl never retokenizes text (the
tokens a model sampled cannot be recovered from it), so every record is quarantined as
``no_token_ids`` with a message saying how to capture IDs instead."""

from __future__ import annotations

from typing import Any, ClassVar

from prl.formats.base import Format, ParseOptions, Quarantined, Sample

HOW_TO_FIX = (
    "text only, no token IDs; text is never retokenized: capture IDs at the server "
    "(vLLM return_token_ids / return_tokens_as_token_ids, SGLang /generate, TGI details)"
)

_ID_KEYS = ("prompt_token_ids", "token_ids", "input_ids", "output_ids")


def _has_ids(obj: dict[str, Any]) -> bool:
    if any(key in obj for key in _ID_KEYS):
        return True
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        if any(key in choice for key in _ID_KEYS) or "provider_specific_fields" in choice:
            return True
        message = choice.get("message")
        if isinstance(message, dict) and "generation_token_ids" in message:
            return True
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if isinstance(content, list) and content and isinstance(content[0], dict):
            token = content[0].get("token")
            return isinstance(token, str) and token.startswith("token_id:")
    return False


class OpenAIText(Format):
    """Quarantines text-only OpenAI chat, Responses API and ``messages`` records as ``no_token_ids``."""

    name: ClassVar[str] = "openai_text"
    description: ClassVar[str] = "text-only OpenAI chat / Responses API / messages records (quarantined)"

    def detect(self, obj: Any) -> bool:
        if not isinstance(obj, dict) or _has_ids(obj):
            return False
        kind = obj.get("object")
        if kind in ("chat.completion", "text_completion", "response"):
            return True
        if isinstance(obj.get("output"), list) and ("input" in obj or "instructions" in obj):
            return True  # a logged Responses API exchange
        return isinstance(obj.get("messages"), list) and "choices" not in obj and "response" not in obj

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        raise Quarantined("no_token_ids", HOW_TO_FIX)
