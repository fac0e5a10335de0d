"""Small, strict helpers the format readers share: typed field access that raises :class:`Quarantined`
instead of ``KeyError``/``TypeError``, request-side metadata (sampling settings, sessions, timestamps), and
stable request IDs for records that carry none.

Everything here touches one record's scalar fields; per-token values stay in Arrow (see
:mod:`prl.formats.base` and :mod:`prl.formats.logprobs`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from prl.formats.base import ParseOptions, Quarantined, Sample, dumps, token_id_array

BAD_SHAPE = "bad_shape"


def as_dict(value: Any, what: str, reason: str = BAD_SHAPE) -> dict[str, Any]:
    """``value`` if it is a JSON object, else :class:`Quarantined` with ``reason``."""
    if not isinstance(value, dict):
        raise Quarantined(reason, f"{what} is {type(value).__name__}, expected an object")
    return value


def as_list(value: Any, what: str, reason: str = BAD_SHAPE) -> list[Any]:
    """``value`` if it is a JSON array, else :class:`Quarantined` with ``reason``."""
    if not isinstance(value, list):
        raise Quarantined(reason, f"{what} is {type(value).__name__}, expected a list")
    return value


def opt_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (for optional metadata blocks)."""
    return value if isinstance(value, dict) else {}


def opt_str(value: Any) -> str | None:
    """A string, or an integer ID rendered as one; anything else is None."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def opt_float(value: Any) -> float | None:
    """A finite-or-not JSON number as float; booleans and other types are None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def opt_int(value: Any) -> int | None:
    """A JSON integer (or integral float such as ``40.0``); anything else is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def choice_index(value: Any, default: int, what: str) -> int:
    """A choice's ``index``: a non-negative integer, or ``default`` when absent."""
    if value is None:
        return default
    index = opt_int(value)
    if index is None or index < 0:
        raise Quarantined(BAD_SHAPE, f"{what} index {value!r} is not a non-negative integer")
    return index


def json_text(value: Any) -> str:
    """Compact JSON text (``messages`` and other pass-through fields); integers beyond 64 bits, which
    orjson refuses, go through the standard library instead."""
    try:
        return dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


# --- record-level conventions ----------------------------------------------------------------------------

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


def as_version(value: Any) -> str | None:
    """Policy versions are kept as text (``"step-120"``, ``"120"``)."""
    if value is None or isinstance(value, bool):
        return None
    return str(value)


def metadata_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def session_of(obj: dict[str, Any]) -> tuple[str | None, int | None]:
    """Session id and 0-based turn from ``session_id`` / ``metadata.session_id`` (or ``user``) and ``turn``."""
    meta = metadata_of(obj)
    session = first_id(obj.get("session_id"), meta.get("session_id"), meta.get("conversation_id"))
    turn = obj.get("turn") if obj.get("turn") is not None else meta.get("turn")
    return session, opt_int(turn)


def first_id(*values: Any) -> str | None:
    """The first of ``values`` that names something, as text: a non-empty string as it is, an integer exactly
    (``0`` too; never through a float), any other number as written. ``false`` / ``true``, objects and lists
    name nothing."""
    for value in values:
        if isinstance(value, bool) or value is None or value == "" or isinstance(value, dict | list):
            continue
        return str(value)
    return None


def messages_of(obj: dict[str, Any]) -> str | None:
    """The chat ``messages`` a record carries (top level or under ``metadata``), as compact JSON text."""
    messages = obj.get("messages")
    if messages is None:
        messages = metadata_of(obj).get("messages")
    if not isinstance(messages, list):
        return None
    return json_text(messages)


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
        if value is not None and not isinstance(value, bool):  # as_version, inline: it runs per sample
            return str(value)
    return options.policy_version


# --- timestamps ----------------------------------------------------------------------------------------

MS_THRESHOLD = 1e11
"""Epoch numbers above this are milliseconds (1e11 s is the year 5138; 1e11 ms is 1973)."""
MS_LIMIT = 253402300800000
"""9999-12-31T23:59:59Z + 1 s in milliseconds: larger numbers are not timestamps."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _epoch(value: Any) -> datetime | float | None:
    """An aware datetime (from a ``datetime`` or an ISO-8601 string; naive ones are read as UTC) or epoch
    milliseconds (from epoch seconds or milliseconds); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, datetime):  # CSV and Parquet readers hand over typed timestamps
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, (int, float)):
        if value < 0 or value >= MS_LIMIT or not math.isfinite(value):  # ints of any size compare exactly
            return None
        return value if value > MS_THRESHOLD else value * 1000.0
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return None


def _ms(moment: datetime | float) -> int:
    return round(moment.timestamp() * 1000.0) if isinstance(moment, datetime) else round(moment)


def timestamp_ms(value: Any) -> int | None:
    """Milliseconds since the epoch (UTC) from epoch seconds, epoch milliseconds, an ISO-8601 string or a
    ``datetime`` (naive ones are read as UTC). Unparseable values are None: a timestamp is metadata, not a reason to
    drop a sample. Side-table events keep this resolution (their event ids hash it)."""
    moment = _epoch(value)
    if moment is None:
        return None
    ms = _ms(moment)
    return ms if ms < MS_LIMIT else None


def timestamp_us(value: Any) -> int | None:
    """Microseconds since the epoch (UTC), read as :func:`timestamp_ms` reads, keeping the sub-millisecond part a
    value carries (ISO-8601 fractions up to microseconds, fractional epoch seconds or milliseconds): a sample's
    ``created_at``. The result always rounds to :func:`timestamp_ms`'s milliseconds (a time exactly between two
    milliseconds, or one a float carries to less than a microsecond, moves by a microsecond), so the inline reward
    events a sample carries keep the event ids an ingest gave them before microseconds were kept."""
    moment = _epoch(value)
    if moment is None:
        return None
    ms = _ms(moment)
    if ms >= MS_LIMIT:
        return None
    us = (moment - _EPOCH) // _MICROSECOND if isinstance(moment, datetime) else round(moment * 1000)
    return min(max(us, ms * 1000 - 499), ms * 1000 + 499)


# --- request-side metadata -----------------------------------------------------------------------------


@dataclass(slots=True)
class RequestSide:
    """What the request (or an envelope around it) says about a sample; None where it says nothing.

    ``messages`` is compact JSON text; ``created_at_us`` is epoch microseconds (UTC)."""

    prompt_token_ids: pa.Array | None = None
    messages: str | None = None
    session_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    logprobs_mode: str | None = None
    created_at_us: int | None = None
    model: str | None = None
    policy_version: str | None = None

    def fill(self, sample: Sample) -> Sample:
        """Set every field of ``sample`` that the response left empty from the request side. A prompt from
        the request replaces an empty response prompt (servers echo prompt IDs only when asked)."""
        if self.prompt_token_ids is not None and len(sample.prompt_token_ids) == 0:
            sample.prompt_token_ids = self.prompt_token_ids
        for name in (
            "messages",
            "session_id",
            "temperature",
            "top_p",
            "top_k",
            "logprobs_mode",
            "model",
            "policy_version",
        ):
            if getattr(sample, name) is None:
                setattr(sample, name, getattr(self, name))
        sample.created_at_us = finer_time(sample.created_at_us, self.created_at_us)
        return sample


def finer_time(response_us: int | None, request_us: int | None) -> int | None:
    """The finer of a record's two timestamps (epoch µs): a request-side time finer than a second replaces a
    response ``created`` given in whole seconds (OpenAI-style ``created`` has one-second resolution, so turns
    sampled within one second would tie); otherwise the response side wins."""
    if response_us is None:
        return request_us
    if request_us is not None and response_us % 1_000_000 == 0 and request_us % 1_000_000 != 0:
        return request_us
    return response_us


def sampling_settings(params: dict[str, Any]) -> dict[str, Any]:
    """Temperature, top-p, top-k and logprobs mode from an OpenAI/vLLM/SGLang/TGI request body or its
    ``sampling_params``/``parameters`` block. vLLM's ``top_k = -1`` (and 0) mean "no top-k filtering" and
    are kept as given; ``logprobs_mode`` is vLLM's ``raw_logprobs``/``processed_logprobs``/… when the
    request names it."""
    blocks = [params[key] for key in ("sampling_params", "parameters") if isinstance(params.get(key), dict)]
    blocks.append(params)

    def first(key: str, convert: Any) -> Any:
        for block in blocks:
            value = convert(block.get(key))
            if value is not None:
                return value
        return None

    return {
        "temperature": first("temperature", opt_float),
        "top_p": first("top_p", opt_float),
        "top_k": first("top_k", opt_int),
        "logprobs_mode": first("logprobs_mode", opt_str),
    }


def request_session(request: dict[str, Any]) -> str | None:
    """``session_id``, else ``metadata.session_id``, else ``user`` (OpenAI's end-user field)."""
    return (
        opt_str(request.get("session_id"))
        or opt_str(opt_dict(request.get("metadata")).get("session_id"))
        or opt_str(request.get("user"))
    )


def request_side(request: dict[str, Any], created: Any = None) -> RequestSide:
    """Read a request body: prompt IDs (vLLM/SGLang ``prompt_token_ids``/``input_ids``/``token_ids``, or a
    completions ``prompt`` given as a list of IDs), ``messages``, session, sampling settings, model and a
    creation time (``created`` overrides the request's own ``created``/``timestamp``)."""
    prompt_ids = None
    for key in ("prompt_token_ids", "input_ids", "token_ids"):
        if isinstance(request.get(key), list):
            prompt_ids = token_id_array(request[key], f"request {key}")
            break
    else:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
            prompt_ids = token_id_array(prompt, "request prompt")
    messages = request.get("messages")
    if messages is None:
        messages = request.get("input") if isinstance(request.get("input"), list) else None
    settings = sampling_settings(request)
    return RequestSide(
        prompt_token_ids=prompt_ids,
        messages=json_text(messages) if messages is not None else None,
        session_id=request_session(request),
        created_at_us=timestamp_us(created if created is not None else request.get("created")),
        model=opt_str(request.get("model")),
        **settings,
    )


# --- IDs -----------------------------------------------------------------------------------------------

DERIVED_ID_PREFIX = "sha256:"


def derived_request_id(*arrays: pa.Array, salt: str | None = None, floats: list[pa.Array] | None = None) -> str:
    """A stable request ID for records that carry none (TGI responses, RL rollout dumps):
    ``"sha256:"`` + the first 32 hex digits of a SHA-256 over the records' token IDs, each array as
    little-endian int64 preceded by its length, then ``salt`` (UTF-8) when given. The same tokens (and salt)
    always give the same ID, whatever the JSON formatting; different token sequences give different IDs.
    ``salt`` holds whatever tells apart samples whose tokens coincide (a rollout's index, a batch row);
    ``floats`` (logprobs, as little-endian float64, NaN for null) are hashed after the IDs when given."""
    digest = hashlib.sha256()
    for array in arrays:
        values = np.asarray(array.to_numpy(zero_copy_only=False), dtype="<i8")
        digest.update(np.int64(len(values)).astype("<i8").tobytes())
        digest.update(values.tobytes())
    for values in floats or []:  # logprobs: records that differ only in them are different samples
        data = np.asarray(values.to_numpy(zero_copy_only=False), dtype="<f8")
        digest.update(b"f" + np.int64(len(data)).astype("<i8").tobytes() + data.tobytes())
    if salt is not None:
        digest.update(salt.encode("utf-8", errors="surrogatepass"))
    return DERIVED_ID_PREFIX + digest.hexdigest()[:32]
