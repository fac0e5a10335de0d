"""What every wire-format reader shares: the parsed sample, the quarantine signal, and strict, vectorized
converters from decoded JSON values to Arrow arrays.

A format reader sees one decoded record (a dict) at a time and returns one :class:`Sample` per choice, or a
:class:`Quarantined` for a choice (or record) it must not keep. Per-token values are never touched in Python:
lists decoded from JSON go to Arrow in one C++ conversion each, and every per-token operation after that is an
Arrow or numpy kernel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from operator import methodcaller
from typing import Any, ClassVar

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from prl.io.sources import lines_of


class Quarantined(Exception):
    """A record (or one choice of it) that must go to quarantine, with a reason code and a readable message."""

    def __init__(self, reason: str, message: str, choice_index: int | None = None) -> None:
        # a message quoting the record may quote a lone surrogate: escape it, the quarantine row must be UTF-8
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.choice_index = choice_index


@dataclass(slots=True)
class Sample:
    """One sampled completion as read from the wire, before validation and assembly into Arrow columns.

    Token arrays are Arrow arrays: ``*_token_ids`` int64 (range-checked to int32 on assembly),
    ``completion_logprobs`` float64 with nulls where the server gave none, ``topk_*`` list arrays of
    ``[completion_len][k]``. ``created_at_us`` is microseconds since the Unix epoch, UTC.
    """

    request_id: str
    choice_index: int
    prompt_token_ids: pa.Array
    completion_token_ids: pa.Array
    completion_logprobs: pa.Array
    finish_reason: str | None
    session_id: str | None = None
    turn: int | None = None
    agent_id: str | None = None
    group_key: str | None = None
    policy_version: str | None = None
    policy_version_spans: list[dict[str, Any]] | None = None
    model: str | None = None
    created_at_us: int | None = None
    completion_mask: pa.Array | None = None
    topk_ids: pa.Array | None = None
    topk_logprobs: pa.Array | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    logprobs_mode: str | None = None
    messages: str | None = None
    completion_text: str | None = None
    rewards: dict[str, Any] | None = None
    """Reward values the record carries (a rollout dump's ``reward``), name → value as written; ingest puts
    them in the ``rewards`` table for this sample, validated there."""


@dataclass(slots=True)
class RawRecord:
    """One framed record of a source: its 1-based line number, raw bytes, and decoded JSON (or the error)."""

    line: int
    raw: bytes
    obj: Any = None
    error: Quarantined | None = None
    unfinished: int | None = None
    """Set on a record still open where its source ends (an SSE stream before its ``[DONE]``): the source bytes
    it spans, from its first line to the end. A reader of a file still being written leaves it for a later run."""


def joined_record(parts: list[RawRecord], key: str, done_key: str, done: bool) -> RawRecord:
    """The lines of one stream (NDJSON chunks, SSE events) as one record: its first line's number, its lines as
    raw, their objects under ``key`` and whether the stream ended under ``done_key``."""
    raw = b"\n".join(r.raw for r in parts)
    return RawRecord(parts[0].line, raw, {key: [r.obj for r in parts], done_key: done})


@dataclass(slots=True)
class ParseOptions:
    """Options that apply to every record: the policy version and finish reason for records that carry none,
    the field naming the centering group, and the field naming the agent inside a session."""

    policy_version: str | None = None
    group_field: str | None = None
    finish_reason: str | None = None
    agent_field: str | None = None


class Format:
    """Base class of a wire format. Subclasses set ``name``, implement :meth:`detect` and :meth:`parse`;
    a format whose records span several lines (SSE streams) overrides :meth:`frame` (and may override
    :meth:`frame_blocks`)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def detect(self, obj: Any) -> bool:
        """Whether a decoded record looks like this format."""
        raise NotImplementedError

    def reader(self, obj: Any) -> Format:
        """The format that reads one decoded record of a file in this format: itself, except for a file whose
        records are detected one by one (:class:`prl.formats.registry.PerRecord`)."""
        return self

    def sniff(self, head: list[RawRecord]) -> bool:
        """Whether a file whose first framed records are ``head`` is in this format."""
        decoded = [r.obj for r in head if r.error is None]
        return bool(decoded) and self.detect(decoded[0])

    def frame(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """Turn numbered lines into records. Default: one JSON document per non-blank line."""
        for line_no, raw in lines:
            if not raw.strip():
                continue
            yield decode_json_line(line_no, raw)

    def frame_blocks(self, blocks: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """The records of a whole source given as :meth:`prl.io.sources.LineReader.blocks` yields it: the same
        records as :meth:`frame` of its lines. A format that can frame whole blocks faster overrides it."""
        return self.frame(lines_of(blocks))

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        """Samples (one per choice) or quarantine signals for one decoded record."""
        raise NotImplementedError


MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Longest record (one JSON line) prl decodes: 64 MiB. Decoding JSON into Python objects takes about ten times
a line's size, so a longer line is quarantined as ``line_too_long`` (its first bytes kept) instead of taking
gigabytes. (The largest records real servers write, a 32k-token chat completion with top-20 heads, take
about 40 MiB.)"""


def decode_json(raw: bytes | str) -> Any:
    """Decode one JSON document. orjson first; the standard library (which accepts NaN / Infinity, as
    Python-written JSONL often holds, and lone surrogate escapes) only for what orjson refuses, so such values
    reach validation and get their own reason code instead of ``malformed_json``.

    orjson reads an integer beyond 64 bits as a float (2^70 and 2^70 + 1 both become ``1.1805916207174113e+21``),
    so text that may hold one (:func:`may_hold_big_integer`) is decoded by the standard library, which keeps
    every integer exact: an ID stays the integer it was written as.

    Raises :class:`Quarantined` ``too_deep`` for nesting beyond orjson's limit (1024 levels), and ``ValueError``
    for text that is not JSON."""
    try:
        if may_hold_big_integer(raw):
            raise orjson.JSONDecodeError("an integer may be beyond 64 bits", "", 0)
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc) or "recursion" in str(exc).lower():
            raise Quarantined("too_deep", f"JSON nested beyond {DEPTH_LIMIT} levels") from None
        import json

        try:
            return json.loads(raw)
        except RecursionError:
            raise Quarantined("too_deep", f"JSON nested beyond {DEPTH_LIMIT} levels") from None


_BIG_INTEGER = re.compile(rb"(?<![\d.])(?:\d{20}|9\d{18})")
"""Twenty digits, or nineteen starting with 9, not after a digit or a decimal point: every integer beyond
orjson's range (above 2^64 - 1, below -2^63) is spelled so. A float's fraction follows its point; a digit run
inside a string (or an integer that orjson would keep) is a false alarm, decoded by the slower decoder."""


_DIGIT_RUNS = bytes(0x30 if 0x30 <= b <= 0x39 else b if b == 0x2E else 0x20 for b in range(256))
"""Every digit as ``0``, a point as itself, any other byte as a blank: nineteen digits not after a point are
then one substring, found at memory speed."""
_RUN = b" " + b"0" * 19


def may_hold_big_integer(raw: bytes | str) -> bool:
    """Whether JSON text may hold an integer orjson cannot keep exact (beyond 64 bits): a translation and a
    substring search over the text (both at memory speed), and only where they find a long run of digits, the
    exact pattern :data:`_BIG_INTEGER`."""
    text = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if _RUN not in (b" " + text).translate(_DIGIT_RUNS):
        return False
    return _BIG_INTEGER.search(text) is not None


DEPTH_LIMIT = 1024
"""orjson's nesting limit: deeper documents are ``too_deep``."""


def decode_json_line(line_no: int, raw: bytes) -> RawRecord:
    """One framed line decoded, or its quarantine signal (``line_too_long``, ``too_deep``, ``malformed_json``)."""
    if len(raw) > MAX_RECORD_BYTES:
        return RawRecord(
            line_no,
            raw[:RAW_PREFIX],
            None,
            Quarantined(
                "line_too_long", f"the line has {len(raw)} bytes, over the {MAX_RECORD_BYTES}-byte record limit"
            ),
        )
    try:
        return RawRecord(line_no, raw, decode_json(raw))
    except Quarantined as q:
        return RawRecord(line_no, raw, None, q)
    except (ValueError, UnicodeDecodeError) as exc:
        return RawRecord(line_no, raw, None, Quarantined("malformed_json", f"not valid JSON: {exc}"))


RAW_PREFIX = 64 * 1024
"""Bytes of an over-long line kept for its quarantine row."""


# --- strict converters -----------------------------------------------------------------------------------

TOKEN_ID_PREFIX = "token_id:"


def json_list(values: Any, what: str, reason: str, expected: str) -> pa.Array:
    """A JSON list as one Arrow array, its type inferred in one C++ pass; anything that is not a list, or
    mixes types Arrow cannot unify, is :class:`Quarantined` with ``reason``. Callers then check the type.
    An Arrow array (a list already converted, as the bulk SSE join gives) is returned as it is."""
    if isinstance(values, pa.Array):
        return values
    if not isinstance(values, list):
        raise Quarantined(reason, f"{what} is {type(values).__name__}, expected {expected}")
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise Quarantined(reason, f"{what} is not {expected}: {exc}") from None


def token_id_array(values: Any, what: str) -> pa.Array:
    """IDs as int64 from a JSON list of ints or of ``"token_id:N"`` strings (vLLM ``return_tokens_as_token_ids``).

    Raises :class:`Quarantined` (``bad_token_id``) for floats, booleans, nulls, other strings or mixed lists;
    Arrow would otherwise truncate ``1.5`` to ``1`` silently.
    """
    array = json_list(values, what, "bad_token_id", "a list of token IDs")
    if pa.types.is_null(array.type) and len(array) == 0:
        return pa.array([], pa.int64())
    if array.null_count:
        raise Quarantined("bad_token_id", f"{what} has null entries")
    if pa.types.is_integer(array.type):
        return array.cast(pa.int64())
    if pa.types.is_string(array.type):
        return parse_token_id_strings(array, what)
    raise Quarantined("bad_token_id", f"{what} holds {array.type} values, expected integers")


def parse_token_id_strings(strings: pa.Array, what: str) -> pa.Array:
    """``"token_id:N"`` strings → int64, vectorized. Any other string means the server sent token *text*
    (no IDs), which prl never retokenizes: ``no_token_ids``."""
    if strings.null_count:
        raise Quarantined("bad_token_id", f"{what} has null entries")
    if len(strings) and not pc.all(pc.starts_with(strings, TOKEN_ID_PREFIX)).as_py():
        raise Quarantined(
            "no_token_ids",
            f"{what} holds token text, not IDs (start the server with return_tokens_as_token_ids or "
            "return_token_ids); text is never retokenized",
        )
    digits = pc.utf8_slice_codeunits(strings, len(TOKEN_ID_PREFIX))
    try:
        return pc.cast(digits, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise Quarantined("bad_token_id", f"{what} has a malformed 'token_id:N' entry") from None


def reject_booleans(values: Any, what: str, key: str | None = None) -> None:
    """``bad_logprob`` when a JSON list of logprobs (or of objects, their ``key`` field) holds ``true`` /
    ``false``: Arrow would read them as 1.0 / 0.0 when they mix with numbers, and a 0.0 logprob reads as
    "certain". The check is ``set(map(type, ...))``: C-level iteration, no per-token Python."""
    if not isinstance(values, list):
        return
    if key is None:
        types = set(map(type, values))
    else:
        try:
            types = set(map(type, map(methodcaller("get", key), values)))
        except (AttributeError, TypeError):  # entries that are not objects: the converters refuse them
            types = {type(entry.get(key)) for entry in values if type(entry) is dict}
    if bool in types:
        raise Quarantined("bad_logprob", f"{what} holds booleans, expected numbers")


def reject_head_booleans(entries: Any, what: str, heads_key: str = "top_logprobs", key: str = "logprob") -> None:
    """``bad_logprob`` when a top-k head holds ``true`` / ``false``: the objects listed under each entry's
    ``heads_key`` (an OpenAI chat entry's ``top_logprobs``), their ``key`` field. Arrow reads such a value as
    1.0 / 0.0 beside numbers, and a head logprob of 0.0 reads as "certain". C-level iteration, as
    :func:`reject_booleans`; entries of another shape are left to the converters, which refuse them."""
    if not isinstance(entries, list):
        return
    try:
        heads = list(chain.from_iterable(filter(None, map(methodcaller("get", heads_key), entries))))
    except (AttributeError, TypeError):
        return
    reject_booleans(heads, f"{what}.{heads_key}", key)


def reject_nested_booleans(lists: Any, what: str, key: str | None = None) -> None:
    """``bad_logprob`` when a list of lists (TGI's ``top_tokens``: objects, their ``key``; completions'
    ``top_logprobs``: ``{token: logprob}`` objects, ``key`` None for their values) holds a boolean."""
    if not isinstance(lists, list):
        return
    try:
        if key is None:
            values = list(chain.from_iterable(map(dict.values, filter(None, lists))))
        else:
            values = list(chain.from_iterable(filter(None, lists)))
    except (AttributeError, TypeError):
        return
    reject_booleans(values, what, key)


def as_float64(values: pa.Array, what: str) -> pa.Array:
    """Integer or floating logprobs as float64. An integer beyond 2^53 in magnitude, which no float64 holds
    exactly, is ``bad_logprob`` (no logprob is such a number)."""
    try:
        return values.cast(pa.float64())
    except (pa.ArrowInvalid, OverflowError):
        raise Quarantined(
            "bad_logprob", f"{what} holds an integer beyond 2^53, which no float64 holds exactly"
        ) from None


def logprob_array(values: Any, what: str) -> pa.Array:
    """Logprobs as float64 (nulls kept) from a JSON list of numbers and nulls. Booleans and strings are
    ``bad_logprob``; NaN, infinities and positive values pass through to validation."""
    reject_booleans(values, what)
    array = json_list(values, what, "bad_logprob", "a list of numbers")
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), pa.float64())
    if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
        return as_float64(array, what)
    raise Quarantined("bad_logprob", f"{what} holds {array.type} values, expected numbers")


def typed_array(values: list[Any] | pa.Array, type_: pa.DataType, reason: str, what: str) -> pa.Array:
    """Convert nested JSON (lists of dicts) to a declared Arrow type in one C++ pass; missing keys become
    nulls, extra keys are ignored, anything else is quarantined with ``reason``. An Arrow array of that
    type is returned as it is."""
    if isinstance(values, pa.Array) and values.type == type_:
        return values
    if pa.types.is_map(type_):
        require_map_entries(values, reason, what)
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise Quarantined(reason, f"{what} has an unexpected shape: {exc}") from None


_MAP_ENTRY_TYPES = frozenset({dict, type(None)})


def require_map_entries(values: Any, reason: str, what: str) -> None:
    """Every entry of a list bound for an Arrow map column must be a JSON object (or null).

    Arrow also reads a map entry from a list of (key, value) pairs, and aborts the whole process (a failed
    C++ check, not an exception) on such a list holding a null; JSON maps are objects, so anything else is
    refused here first. The check is ``set(map(type, values))``: C-level, no per-token Python."""
    if not isinstance(values, list) or not set(map(type, values)) <= _MAP_ENTRY_TYPES:
        raise Quarantined(reason, f"{what} must be a list of JSON objects, one per position")


def sort_heads_descending(ids: pa.ListArray, logprobs: pa.ListArray) -> tuple[pa.ListArray, pa.ListArray]:
    """Order each position's head by logprob, highest first (for heads that arrive as dicts, whose order
    carries no meaning). ``ids``/``logprobs`` are ``[positions][k]`` lists with identical offsets."""
    if len(ids) == 0:
        return ids, logprobs
    parents = pc.list_parent_indices(ids)
    flat_lp = pc.list_flatten(logprobs)
    order = pc.sort_indices(
        pa.table({"p": parents, "lp": flat_lp}), sort_keys=[("p", "ascending"), ("lp", "descending")]
    )
    offsets = ids.offsets
    return (
        pa.ListArray.from_arrays(offsets, pc.take(pc.list_flatten(ids), order)),
        pa.ListArray.from_arrays(offsets, pc.take(flat_lp, order)),
    )


def drop_extra_sampled(
    head_ids: pa.ListArray, head_logprobs: pa.ListArray, sampled_ids: pa.Array, k: int | None = None
) -> tuple[pa.ListArray, pa.ListArray]:
    """vLLM returns the sampled token inside the top-k dict even when it ranked below k, giving k+1 entries.
    Remove that extra entry so every position holds exactly the sampler's top k (``k`` defaults to the
    smallest head size)."""
    lengths = pc.list_value_length(head_ids)
    if len(lengths) == 0:
        return head_ids, head_logprobs
    if k is None:
        k = pc.min(lengths).as_py() or 0
    if pc.all(pc.equal(lengths, k)).as_py():
        return head_ids, head_logprobs
    parents = pc.list_parent_indices(head_ids)
    flat_ids = pc.list_flatten(head_ids)
    row_long = pc.take(pc.equal(lengths, k + 1), parents)
    is_sampled = pc.equal(flat_ids, pc.take(sampled_ids, parents))
    keep = pc.invert(pc.and_(row_long, is_sampled))
    kept_parents = pc.filter(parents, keep).to_numpy()
    new_lengths = np.bincount(kept_parents, minlength=len(lengths))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(new_lengths, out=offsets[1:])
    return (
        pa.ListArray.from_arrays(pa.array(offsets), pc.filter(flat_ids, keep)),
        pa.ListArray.from_arrays(pa.array(offsets), pc.filter(pc.list_flatten(head_logprobs), keep)),
    )


def _head_layout(ids: pa.ListArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lengths (int64, null heads as 0), start offsets (into the flattened entries, one more than heads) and
    each entry's position, of ``[positions][k]`` heads."""
    lengths = np.asarray(pc.fill_null(pc.list_value_length(ids), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return lengths, starts, np.repeat(np.arange(len(lengths)), lengths)


def _flat_floats(values: pa.ListArray) -> np.ndarray:
    return np.asarray(pc.fill_null(pc.list_flatten(values), np.nan).to_numpy(zero_copy_only=False), dtype=np.float64)


def _flat_ints(values: pa.ListArray) -> np.ndarray:
    return np.asarray(pc.list_flatten(values).to_numpy(zero_copy_only=False), dtype=np.int64)


def sampled_first_heads(ids: pa.ListArray, logprobs: pa.ListArray, sampled_ids: pa.Array) -> tuple[bool, bool]:
    """Whether heads have vLLM's chat shape: (every position has a head of one same size whose first entry is
    its sampled token, some head is not ordered highest logprob first). Heads as sent, ``[positions][k]``. Heads
    of k and k + 1 entries are the whole dict instead (:func:`drop_extra_sampled` makes them exact)."""
    if len(ids) == 0 or len(ids) != len(sampled_ids):
        return False, False
    lengths, starts, parents = _head_layout(ids)
    if not lengths[0] or not (lengths == lengths[0]).all():
        return False, False
    sampled = np.asarray(sampled_ids.to_numpy(zero_copy_only=False), dtype=np.int64)
    first = bool((_flat_ints(ids)[starts[:-1]] == sampled).all())
    lps = _flat_floats(logprobs)
    unsorted = bool(((parents[1:] == parents[:-1]) & (lps[1:] > lps[:-1])).any())
    return first, unsorted


def keep_best(ids: pa.ListArray, logprobs: pa.ListArray, k: int) -> tuple[pa.ListArray, pa.ListArray]:
    """Each head ordered highest logprob first and cut to its first ``k`` entries."""
    lengths, starts, parents = _head_layout(ids)
    offsets = pa.array(starts.astype(np.int32))
    ids, logprobs = sort_heads_descending(
        pa.ListArray.from_arrays(offsets, pc.list_flatten(ids)),
        pa.ListArray.from_arrays(offsets, pc.list_flatten(logprobs)),
    )
    keep = pa.array((np.arange(len(parents)) - starts[:-1][parents]) < k)
    kept = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(np.minimum(lengths, k), out=kept[1:])
    new_offsets = pa.array(kept)
    return (
        pa.ListArray.from_arrays(new_offsets, pc.filter(pc.list_flatten(ids), keep)),
        pa.ListArray.from_arrays(new_offsets, pc.filter(pc.list_flatten(logprobs), keep)),
    )


def exact_chat_heads(samples: list[Sample | Quarantined]) -> None:
    """Make vLLM chat heads the exact top k - 1, in place, for a whole response (every choice the same k).

    vLLM's chat serving (vllm-project/vllm ``vllm/entrypoints/openai/chat_completion/serving.py``, earlier
    ``serving_chat.py``: ``_get_top_logprobs``) takes each position's ``top_logprobs`` as the first k items of the
    sampler's per-position logprob dict, and that dict holds the sampled token first, then the best tokens in rank
    order (``vllm/v1/engine/logprobs.py``, ``_make_logprob_dict``: ranks ``(sampled rank, 1, 2, ...)``). So a list reads ``[sampled, best, 2nd best, ...]``, unsorted where the sampled
    token is not the best: if the sampled token ranks within the top k the list is the exact top k, else the top
    k - 1 plus the sampled token. Ordered by logprob, its first k - 1 entries are the exact top k - 1 either way.

    The rule applies to a response whose every head (of every choice with heads) has the same size k and starts
    with the sampled token while some head is unsorted (no other server sends that shape): every head of the
    response is ordered and cut to k - 1, so the heads of a sample, and of the samples of one response, share
    one k. A response whose heads are all sorted is left as sent (it is the exact top k). Nothing else is
    changed."""
    with_heads = [s for s in samples if isinstance(s, Sample) and s.topk_ids is not None]
    if not with_heads:
        return
    sizes = {int(pc.min(pc.list_value_length(s.topk_ids)).as_py() or 0) for s in with_heads}
    if len(sizes) != 1:
        return
    unsorted = False
    for sample in with_heads:
        first, disorder = sampled_first_heads(sample.topk_ids, sample.topk_logprobs, sample.completion_token_ids)
        if not first:
            return
        unsorted |= disorder
    if not unsorted:
        return
    k = sizes.pop() - 1
    for sample in with_heads:
        if k <= 0:  # no exact head is known
            sample.topk_ids = sample.topk_logprobs = None
        else:
            sample.topk_ids, sample.topk_logprobs = keep_best(sample.topk_ids, sample.topk_logprobs, k)


def extra_sampled_everywhere(ids: pa.ListArray, logprobs: pa.ListArray, sampled_ids: pa.Array) -> bool:
    """Whether top-k dicts (vLLM completions) hold k + 1 entries at every position: all heads have one size
    s >= 2 and each holds its sampled token with a logprob no higher than any other entry's. Then the sampled
    entries are the extras (dropping them leaves the exact top s - 1 whichever way it was: if the sampled token
    did rank s-th, the rest is still the top s - 1)."""
    if len(ids) == 0 or len(ids) != len(sampled_ids):
        return False
    lengths, starts, parents = _head_layout(ids)
    if lengths[0] < 2 or not (lengths == lengths[0]).all():
        return False
    sampled = np.asarray(sampled_ids.to_numpy(zero_copy_only=False), dtype=np.int64)
    is_sampled = _flat_ints(ids) == sampled[parents]
    if not (np.bincount(parents[is_sampled], minlength=len(lengths)) == 1).all():
        return False
    lps = _flat_floats(logprobs)
    others = np.minimum.reduceat(np.where(is_sampled, np.inf, lps), starts[:-1])
    return bool((lps[is_sampled] <= others).all())


def dumps(value: Any) -> str:
    """Compact JSON text for ``messages`` and similar pass-through fields."""
    return orjson.dumps(value).decode()


def first_present(obj: dict[str, Any], *keys: str) -> Any:
    """The first key of ``keys`` whose value is not None."""
    for key in keys:
        value = obj.get(key)
        if value is not None:
            return value
    return None
