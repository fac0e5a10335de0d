"""The agent a sampled call belongs to inside a multi-agent session: ``traces.agent_id``.

A trajectory is (session, agent): a planner and its workers share a session, and each agent's calls extend
only that agent's own token history. Where real systems put the agent:

- the field the user names (``--agent-field``), which replaces the built-in keys;
- else ``agent_id``, ``agent_name``, ``agent`` or NeMo Gym rollouts' ``agent_ref``
  (``{"type": "responses_api_agents", "name": ...}``). OpenAI-style request ``metadata`` carries them, and
  LiteLLM's proxy writes its ``agent_id`` there (from the ``x-litellm-agent-id`` header or the calling key);
- else proxy-capture headers ``x-litellm-agent-id``, ``x-agent-id``, ``x-agent-name`` (any case; a dict or a list
  of ``[name, value]`` pairs) on the record or its request.

Keys are looked up in the record, its ``metadata`` (and LiteLLM's ``requester_metadata`` inside it), a LiteLLM
``standard_logging_object`` and its metadata, then the request side of a proxy capture (the request, an HTTP
record's ``body``) and their metadata: nearest first.

A value that is an object (``{"id": ..., "name": ...}``) gives its ``id``, else its ``name``. Strings and
integers are kept as text; anything else counts as absent.
"""

from __future__ import annotations

from typing import Any

AGENT_KEYS = ("agent_id", "agent_name", "agent")
AGENT_HEADERS = ("x-litellm-agent-id", "x-agent-id", "x-agent-name")
_PLACES = frozenset(
    {*AGENT_KEYS, "agent_ref", "metadata", "standard_logging_object", "request", "headers", "request_headers"}
)
"""Top-level keys under which a record may name its agent: a record with none of them (and without the
user's field) names none."""


def _text(value: Any) -> str | None:
    if isinstance(value, dict):
        return _text(value.get("id")) or _text(value.get("name"))
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, int):
        return str(value)
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _blocks(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects that may name the agent, nearest first: the record, its metadata, a LiteLLM payload and its
    metadata, then the request side of an envelope (an HTTP record's ``body`` too) and its metadata."""
    out = [obj]
    payload = _dict(obj.get("standard_logging_object"))
    request = _dict(obj.get("request"))
    body = _dict(request.get("body"))
    for block in (obj, payload, request, body):
        if block and block is not obj:
            out.append(block)
        meta = _dict(block.get("metadata"))
        if meta:
            out.append(meta)
            requester = _dict(meta.get("requester_metadata"))
            if requester:
                out.append(requester)
    return out


def _header(headers: Any) -> str | None:
    if isinstance(headers, dict):
        lowered = {str(k).lower(): v for k, v in headers.items()}
        for name in AGENT_HEADERS:
            found = _text(lowered.get(name))
            if found:
                return found
    elif isinstance(headers, list):
        pairs = {str(p[0]).lower(): p[1] for p in headers if isinstance(p, list | tuple) and len(p) == 2}
        return _header(pairs)
    return None


def agent_of(obj: Any, field: str | None = None) -> str | None:
    """The agent named by a decoded record (see the module docstring for where it is looked up); None when
    the record names none. ``field``: the user's ``--agent-field``, which replaces the built-in lookup."""
    if not isinstance(obj, dict):
        return None
    if obj.keys().isdisjoint(_PLACES) and (not field or field not in obj):
        return None
    blocks = _blocks(obj)
    if field:
        return next((found for block in blocks if (found := _text(block.get(field)))), None)
    for block in blocks:
        for key in (*AGENT_KEYS, "agent_ref"):
            found = _text(block.get(key))
            if found:
                return found
    request = _dict(obj.get("request"))
    for headers in (obj.get("headers"), obj.get("request_headers"), request.get("headers")):
        found = _header(headers)
        if found:
            return found
    return None
