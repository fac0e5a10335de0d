"""Field conventions shared by the OpenAI-style readers: finish reasons, timestamps, versions, sessions."""

from __future__ import annotations

import math
from typing import Any

from prl.formats.base import ParseOptions, Quarantined

FINISH_REASON_MAP = {
    "stop": "stop",
    "eos_token": "stop",
    "stop_sequence": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "length": "length",
    "max_tokens": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "abort": "abort",
    "cancelled": "abort",
    "error": "error",
}


def finish_reason(value: Any) -> str | None:
    """Normalise a server's finish reason (a string, or SGLang's ``{"type": ...}`` dict) to one of
    stop, length, tool_calls, abort, error. Missing → None (ingest then applies ``--finish-reason`` or
    quarantines as ``missing_finish_reason``); unknown → ``bad_finish_reason``."""
    if isinstance(value, dict):
        value = value.get("type")
    if value is None:
        return None
    if isinstance(value, str) and value in FINISH_REASON_MAP:
        return FINISH_REASON_MAP[value]
    raise Quarantined("bad_finish_reason", f"finish reason {value!r} is not one of {sorted(FINISH_REASON_MAP)}")


def epoch_ms(value: Any) -> int | None:
    """Seconds (OpenAI ``created``), milliseconds, or ISO-8601 text → milliseconds since the epoch (UTC)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return None
        # OpenAI 'created' is in seconds; values past year 5138 in seconds are taken as milliseconds.
        return int(value * 1000) if value < 1e11 else int(value)
    if isinstance(value, str):
        from datetime import datetime, timezone

        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return int(parsed.timestamp() * 1000)
    return None


def as_version(value: Any) -> str | None:
    """Policy versions are kept as text (``"step-120"``, ``"120"``)."""
    if value is None or isinstance(value, bool):
        return None
    return str(value)


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def metadata_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def session_of(obj: dict[str, Any]) -> tuple[str | None, int | None]:
    """Session id and 0-based turn from ``session_id`` / ``metadata.session_id`` (or ``user``) and ``turn``."""
    meta = metadata_of(obj)
    session = obj.get("session_id") or meta.get("session_id") or meta.get("conversation_id")
    turn = obj.get("turn") if obj.get("turn") is not None else meta.get("turn")
    return (str(session) if session is not None else None), as_int(turn)


def messages_of(obj: dict[str, Any]) -> str | None:
    """The chat ``messages`` a record carries (top level or under ``metadata``), as compact JSON text."""
    messages = obj.get("messages")
    if messages is None:
        messages = metadata_of(obj).get("messages")
    if not isinstance(messages, list):
        return None
    from prl.formats.base import dumps

    return dumps(messages)


def group_key_of(obj: dict[str, Any], options: ParseOptions) -> str | None:
    """The value of the user-named group field, looked up at top level then under ``metadata``."""
    if not options.group_field:
        return None
    value = obj.get(options.group_field)
    if value is None:
        value = metadata_of(obj).get(options.group_field)
    return None if value is None else str(value)


def policy_version_of(*candidates: Any, options: ParseOptions) -> str | None:
    """The first version the record carries; ``--policy-version`` fills in records that carry none."""
    for value in candidates:
        version = as_version(value)
        if version is not None:
            return version
    return options.policy_version


def require_dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Quarantined("bad_shape", f"{what} is {type(value).__name__}, expected an object")
    return value


def require_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise Quarantined("bad_shape", f"{what} is {type(value).__name__}, expected a list")
    return value
