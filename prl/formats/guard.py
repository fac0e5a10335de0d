"""One record in, rows or reasons out, never an exception: the per-record guard every ingest path calls.

:func:`read_record` runs a format's reader on one decoded record and turns whatever goes wrong into a
:class:`Quarantined` for that record, so a poison record never blocks the rest of its file:

| reason | when |
|---|---|
| ``too_deep`` | nesting beyond what the JSON parser or the converters handle (``RecursionError``) |
| ``out_of_range`` | an integer beyond 64 bits anywhere, or a scalar prl stores (choice index, turn, top-k) beyond int32, a sampling setting beyond float32 |
| ``nonfinite_setting`` | a sampling setting (``temperature``, ``top_p``) that is ``Infinity``, ``-Infinity``, ``NaN`` or a number too large for a double (``1e400``) |
| ``bad_string`` | a string of the record (IDs, model, messages, text, agent, the tokens of its logprobs) holding a lone UTF-16 surrogate: an escape such as ``"\\udfff"`` (valid JSON, not valid Unicode) or its raw bytes (``ED A0 80``, which the standard library's decoder lets through) |
| ``no_token_ids`` | the record holds no token IDs at all: this reason wins over any other the reader gave |
| ``parse_error`` | any other exception a reader raised (a reader bug), with its type and message |

Scalar checks run on each :class:`Sample` the reader returns, so a value that would only fail when a batch of
rows is assembled (and take the whole batch with it) is caught on its own record.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pyarrow as pa

from prl.formats.agents import agent_of
from prl.formats.base import Format, ParseOptions, Quarantined, Sample
from prl.formats.fields import DERIVED_ID_PREFIX
from prl.schema import VERSION_SPAN

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38


def as_quarantined(exc: BaseException) -> Quarantined:
    """The quarantine reason for an exception raised while turning one record into rows."""
    if isinstance(exc, Quarantined):
        return exc
    text = f"{type(exc).__name__}: {exc}"[:500]
    if isinstance(exc, RecursionError):
        return Quarantined("too_deep", f"the record nests too deeply to read ({text})")
    if isinstance(exc, OverflowError) or (
        isinstance(exc, (pa.ArrowInvalid, pa.ArrowTypeError, ValueError))
        and any(word in str(exc).lower() for word in ("overflow", "out of bounds", "out of range", "too large"))
    ):
        return Quarantined("out_of_range", f"a number in the record is out of range ({text})")
    if isinstance(exc, UnicodeError) or "surrogates not allowed" in str(exc):
        return Quarantined("bad_string", f"a string in the record is not valid Unicode ({text})")
    return Quarantined("parse_error", text)


def read_record(
    fmt: Format, obj: Any, options: ParseOptions, position: str | None = None
) -> tuple[str, list[Sample | Quarantined]]:
    """(name of the format that read it, its samples or quarantine signals) for one decoded record.

    ``fmt`` is the file's format (:meth:`Format.reader` picks the one for this record: detection is per
    record). Never raises: every exception becomes a :class:`Quarantined` (see the module table); a reason
    on a record that holds no token IDs anywhere is replaced by ``no_token_ids`` (:func:`text_only_reasons`).
    ``position`` (see :func:`source_position`) makes the derived request IDs of records that carry none
    distinct per position in their source."""
    reader = fmt
    try:
        reader = fmt.reader(obj)
        items = reader.parse(obj, options)
        out = [check_sample(item) if isinstance(item, Sample) else item for item in items]
    except BaseException as exc:  # KeyboardInterrupt / SystemExit are re-raised below
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)):
            raise
        out = [as_quarantined(exc)]
    if not out and type(reader).frame is Format.frame:  # a record must end as samples or as a quarantine row
        out = [Quarantined("no_choices", f"{reader.name} record with no sample in it (an empty choices/outputs list)")]
    if type(reader).frame is Format.frame:  # a decoded JSON record (SSE framers hand over their own objects)
        out = text_only_reasons(obj, out)
    if position is not None:
        for item in out:
            if isinstance(item, Sample) and item.request_id.startswith(DERIVED_ID_PREFIX):
                salted = hashlib.sha256(f"{item.request_id}|{position}".encode()).hexdigest()
                item.request_id = DERIVED_ID_PREFIX + salted[:32]
    return reader.name, out


def apply_options(sample: Sample, options: ParseOptions, obj: Any = None) -> Sample:
    """What the run's options say about a parsed sample: ``--finish-reason`` fills a missing finish reason;
    a named ``--group-field`` the record lacks is ``missing_group_field`` (its group is unknown, and falling
    back to the prompt digest would silently put it in the wrong group). The agent comes from the record
    (:func:`prl.formats.agents.agent_of`, ``--agent-field`` when named) where the reader set none."""
    if sample.finish_reason is None:
        sample.finish_reason = options.finish_reason
    if sample.agent_id is None:
        sample.agent_id = agent_of(obj, options.agent_field)
        if sample.agent_id is not None and not sample.agent_id.isascii() and not is_unicode(sample.agent_id):
            raise Quarantined("bad_string", "agent_id holds a lone UTF-16 surrogate: not valid Unicode")
    if options.group_field and sample.group_key is None:
        raise Quarantined("missing_group_field", f"the record has no {options.group_field!r} field (--group-field)")
    return sample


def source_key(first_record: bytes) -> str:
    """What names a source in :func:`source_position`: a digest of its first record (16 hex digits)."""
    return hashlib.sha256(first_record).hexdigest()[:16]


def source_position(key: str, line: int) -> str:
    """Where a record sits in its source, by content, not by name: the source's :func:`source_key` (a digest of
    its first record) and the record's line number.

    Records without a request ID (TGI, rollout dumps) get IDs derived from their content; two byte-identical
    records (concurrent greedy requests, a group of n identical answers) are still two samples, so the ID
    also takes the record's position. The source is named by its first record, which stays the same when a
    log grows, is renamed or compressed by rotation, or is copied: reading it again under any name gives the
    same IDs and adds nothing, while another file (another first record) gives other IDs."""
    return f"{key}:{line}"


KEPT_REASONS = frozenset({"no_token_ids", "unknown_format"})
"""Reasons :func:`text_only_reasons` keeps: a record of no known format says so, whatever it holds."""


def text_only_reasons(obj: Any, out: list[Sample | Quarantined]) -> list[Sample | Quarantined]:
    """``out`` (what reading the decoded record ``obj`` gave) with each quarantine reason replaced by
    ``no_token_ids`` when ``obj`` holds no token IDs anywhere: the reason a text-only record cannot be kept,
    whatever else is wrong with it (a missing request ID, an empty choice). :data:`KEPT_REASONS` stay."""
    if any(isinstance(item, Quarantined) and item.reason not in KEPT_REASONS for item in out) and _text_only(obj):
        return [
            _no_ids(item) if isinstance(item, Quarantined) and item.reason not in KEPT_REASONS else item for item in out
        ]
    return out


def _no_ids(q: Quarantined) -> Quarantined:
    if q.reason == "no_token_ids":
        return q
    return Quarantined("no_token_ids", f"the record holds no token IDs (also: {q.reason}: {q.message})", q.choice_index)


def check_sample(sample: Sample) -> Sample | Quarantined:
    """``sample`` if every scalar prl stores fits its column (see the module table), else its reason."""
    if _plainly_fits(sample):
        return sample
    try:
        for name in ("choice_index", "turn", "top_k"):
            value = getattr(sample, name)
            if value is not None and not INT32_MIN <= value <= INT32_MAX:
                raise Quarantined("out_of_range", f"{name} {value} does not fit in int32")
        for name in SETTINGS:
            value = getattr(sample, name)
            if value is not None and not math.isfinite(value):
                raise Quarantined("nonfinite_setting", f"{name} {value} is not a finite number")
            if value is not None and abs(value) > FLOAT32_MAX:
                raise Quarantined("out_of_range", f"{name} {value} does not fit in float32")
        for name in _STRING_FIELDS:
            value = getattr(sample, name)
            if value is not None and not (type(value) is str and value.isascii()) and not is_unicode(value):
                raise Quarantined("bad_string", f"{name} holds a lone UTF-16 surrogate: not valid Unicode")
        if sample.policy_version_spans is not None:
            pa.array([sample.policy_version_spans], pa.list_(VERSION_SPAN))
    except Exception as exc:  # any failure here is the record's, reported with its reason
        signal = as_quarantined(exc)
        signal.choice_index = sample.choice_index if isinstance(sample.choice_index, int) else None
        return signal
    return sample


def _plainly_fits(sample: Sample) -> bool:
    """The common sample, checked in a few operations: an int32 choice index and turn, no sampling settings,
    ASCII strings (which hold no surrogate). False means :func:`check_sample` looks field by field."""
    s = sample
    if s.top_k is not None or s.temperature is not None or s.top_p is not None or s.policy_version_spans is not None:
        return False
    if type(s.choice_index) is not int or not INT32_MIN <= s.choice_index <= INT32_MAX:
        return False
    if s.turn is not None and (type(s.turn) is not int or not INT32_MIN <= s.turn <= INT32_MAX):
        return False
    strings = (
        s.request_id,
        s.session_id,
        s.agent_id,
        s.group_key,
        s.policy_version,
        s.model,
        s.finish_reason,
        s.logprobs_mode,
    )
    try:
        text = "".join([v for v in strings if v is not None])
    except TypeError:
        return False
    return text.isascii() and _ascii(s.messages) and _ascii(s.completion_text)


def _ascii(value: Any) -> bool:
    return value is None or (type(value) is str and value.isascii())


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


SETTINGS = ("temperature", "top_p")
"""The sampling settings stored as floats: a value that is not finite (``Infinity``, ``NaN``, ``1e400``) says
nothing about how the sample was drawn, so its record is quarantined (``nonfinite_setting``), never stored."""

_STRING_FIELDS = (
    "request_id",
    "session_id",
    "agent_id",
    "group_key",
    "policy_version",
    "model",
    "finish_reason",
    "logprobs_mode",
    "messages",
    "completion_text",
)

# --- text-only records ---------------------------------------------------------------------------------

ID_KEYS = frozenset(
    {
        "prompt_token_ids",
        "token_ids",
        "input_ids",
        "output_ids",
        "generation_token_ids",
        "response_ids",
        "completion_ids",
        "prompt_ids",
        "output_token_logprobs",
        "prefill",
        "tokens",
    }
)
_WALK_LIMIT = 20_000
"""Containers visited at most when looking for token IDs: a record this large is not text-only."""


def _text_only(obj: Any) -> bool:
    """Whether a decoded record holds no token IDs anywhere: no ID-list key (:data:`ID_KEYS`) with a list of
    integers (or of objects carrying an integer ``id``, TGI's tokens), and no ``"token_id:N"`` string. A
    bounded, iterative walk (never recursion: records may nest deeply)."""
    stack = [obj]
    visited = 0
    while stack:
        node = stack.pop()
        visited += 1
        if visited > _WALK_LIMIT:
            return False
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ID_KEYS and isinstance(value, list) and _ids_like(value):
                    return False
                if isinstance(value, (dict, list)):
                    stack.append(value)
                elif isinstance(value, str) and value.startswith("token_id:"):
                    return False
        elif isinstance(node, list):
            for value in node:
                if isinstance(value, (dict, list)):
                    stack.append(value)
                elif isinstance(value, str) and value.startswith("token_id:"):
                    return False
    return True


def _ids_like(values: list[Any]) -> bool:
    first = values[0] if values else None
    if first is None:
        return False
    if type(first) is int or (isinstance(first, str) and first.startswith("token_id:")):
        return True
    if isinstance(first, dict):
        return type(first.get("id")) is int or type(first.get("token_id")) is int
    if isinstance(first, list):  # batches (SkyRL), SGLang triples [lp, id, text]
        return any(type(v) is int for v in first[:3]) or _ids_like(first)
    return False
