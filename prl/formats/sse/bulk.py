"""Chat streams joined in bulk by Arrow's JSON reader, with no Python object per chunk.

Decoding a stream into one Python dict per chunk costs more than everything else SSE ingest does. For
streams in the canonical layout (:func:`prl.formats.sse.exact._canonical_stream`), :func:`join_streams` hands the
``data:`` payloads of many streams at once to ``pyarrow.json`` (C++, multi-threaded), checks the resulting
columns for the common single-choice chat shape in a few vectorized passes, and gives each stream its
joined choice as Arrow arrays: completion ``token_ids`` (int64), ``logprobs.content`` entries (the
``CHAT_CONTENT_ENTRY`` struct the chat reader reads), text, finish reason, prompt IDs.

It accepts a stream only where the result equals the per-chunk join's
(:func:`prl.formats.sse.exact.join_chunks`), and returns None for it otherwise, so the exact reader
judges it: payloads that are not UTF-8, hold ``NaN``/``Infinity``, non-finite or oversized logprobs, fail
to parse, parse to another number of rows than lines, use an ``index`` other than 0, carry a null or
missing ``delta`` or choice, or give a value to a key whose absence and null differ to that reader
(``delta.token_ids``, the completions-style ``logprobs`` lists, top-level ``error``). Arrow parses doubles
exactly (correctly rounded, as orjson), refuses duplicate keys, and both readers ignore other keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from prl.formats.vllm import CHAT_CONTENT_ENTRY
from prl.numerics.ragged import any_per_row, offsets_of

CHAT_CHUNK = "chat.completion.chunk"
_CHOICE = pa.struct(
    [
        ("index", pa.int64()),
        ("delta", pa.struct([("content", pa.string()), ("token_ids", pa.null())])),
        (
            "logprobs",
            pa.struct(
                [
                    ("content", pa.list_(CHAT_CONTENT_ENTRY)),
                    ("tokens", pa.null()),
                    ("token_logprobs", pa.null()),
                    ("top_logprobs", pa.null()),
                ]
            ),
        ),
        ("finish_reason", pa.string()),
        ("token_ids", pa.list_(pa.int64())),
        ("prompt_token_ids", pa.list_(pa.int64())),
    ]
)
CHUNK_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("object", pa.string()),
        ("choices", pa.list_(_CHOICE)),
        ("prompt_token_ids", pa.list_(pa.int64())),
        ("error", pa.null()),
    ]
)
"""The fields the join reads, and (typed null, so that any other value fails the parse) the keys the exact
reader treats differently when absent and when null or refuses the stream for. Arrow infers all others
(the join ignores them; their types say whether a ``NaN``/``Infinity`` literal may hide in them)."""
_PARSE = pj.ParseOptions(explicit_schema=CHUNK_SCHEMA, unexpected_field_behavior="infer")
_READ = pj.ReadOptions(use_threads=True, block_size=1 << 18)
_NON_FINITE = re.compile(rb"[:,\[]\s*-?(?:NaN|Inf)")
"""A ``NaN``/``Inf``/``Infinity`` value (not JSON: the standard library takes some, Arrow all of them)."""
_EXACT_LIMIT = 2.0**53
"""Logprobs of this magnitude may have been written as integers that the exact reader refuses."""


@dataclass(slots=True)
class JoinedChoice:
    """One stream's only choice, joined: ``token_ids`` ``[n]`` int64 or None, ``content`` ``[n]``
    ``CHAT_CONTENT_ENTRY`` or None, ``text``, ``finish_reason`` and choice-level ``prompt_token_ids``."""

    token_ids: pa.Array | None
    content: pa.Array | None
    text: str
    finish_reason: str | None
    prompt_token_ids: pa.Array | None


@dataclass(slots=True)
class JoinedStream:
    """A stream's top-level ``prompt_token_ids`` (first present, or None) and its choice (None when no chunk
    has one)."""

    prompt_token_ids: pa.Array | None
    choice: JoinedChoice | None


class _Unjoined:
    """The verdict on a stream that is one stream but not in the shape the bulk join reproduces."""

    def __repr__(self) -> str:
        return "UNJOINED"


UNJOINED = _Unjoined()
"""The stream's lines are one stream (every chunk's ``id`` is the first one's, or absent): decode and join
it chunk by chunk."""


_DONE_TAIL = b"\n\ndata: [DONE]\n"
_LINE_START = b"\n\ndata: {"
_CHOICES = b'"choices":'
_SHORT_HEAD = b'\n{"object":"chat.completion.chunk","choices":'
"""What a repeated head becomes: ``object`` stays, so that a second ``object`` key in a line is a duplicate
key (which Arrow refuses) rather than a value that would silently stand for the head's."""


def payloads(stream: bytes, lines: int, trailing: int = 0, stream_id: str | None = None) -> memoryview | None:
    """The NDJSON rows (without a final newline) of a stream's payloads. ``stream`` is ``lines`` lines, each
    followed by one blank line, then a ``data: [DONE]`` line and ``trailing`` blank lines. None unless every
    line begins ``data: {`` (so that each holds at least one JSON object: a line of two objects then shows as
    an extra row) or when the text is not UTF-8.

    When every line after the first begins with the same bytes up to its ``"choices":`` (a head: the id,
    object, created and model servers repeat in each chunk) and that head is a chat chunk's with the stream's
    ``stream_id``, no ``error`` and no ``prompt_token_ids``, those lines keep only ``object`` of it: Arrow then
    parses a third less, and the rows mean what the whole lines mean to the join."""
    rows = _short_rows(stream, lines, stream_id)
    if rows is None:
        rows = stream.replace(_LINE_START, b"\n{")
        if not stream.startswith(b"data: {") or len(stream) - len(rows) != 7 * (lines - 1):
            return None
    if not rows.isascii():
        try:
            rows.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return memoryview(rows)[6 : len(rows) - len(_DONE_TAIL) - trailing]


def _short_rows(stream: bytes, lines: int, stream_id: str | None) -> bytes | None:
    """The stream with each line after the first starting at its shortened head, or None."""
    second = stream.find(b"\n\n") + 2
    choices = stream.find(_CHOICES, second)
    if lines < 2 or stream_id is None or not stream.startswith(b"data: {") or choices < 0:
        return None
    head = stream[second : choices + len(_CHOICES)]
    if b"\n" in head or not head.startswith(b"data: {"):
        return None
    try:
        fields = orjson.loads(head[5:] + b"0}")
    except orjson.JSONDecodeError:
        return None
    if (
        type(fields) is not dict
        or fields.get("object") != CHAT_CHUNK
        or fields.get("id") != stream_id
        or fields.get("error") is not None
        or fields.get("prompt_token_ids") is not None
    ):
        return None
    rows = stream.replace(b"\n\n" + head, _SHORT_HEAD)
    if len(stream) - len(rows) != (len(head) + 2 - len(_SHORT_HEAD)) * (lines - 1):
        return None  # some line does not begin with the head
    return rows


def join_streams(rows: list[memoryview], counts: list[int]) -> list[JoinedStream | _Unjoined | None]:
    """Judge and join streams given as their NDJSON payloads (:func:`payloads`) and line counts, in one
    parse (each on its own if that fails). Per stream: its :class:`JoinedStream`; :data:`UNJOINED`; or None
    when its lines may not be one stream (a chunk with another ``id``, or one Arrow cannot parse): the line
    framer must frame them."""
    table = _parse(b"".join([part for row in rows for part in (row, b"\n")]))
    if table is not None and table.num_rows == sum(counts):
        joined = _join_or_none(table, counts, rows)
        if joined is not None:
            return joined
    out: list[JoinedStream | _Unjoined | None] = []
    for one, count in zip(rows, counts):
        single = _parse(bytes(one) + b"\n")
        joined = _join_or_none(single, [count], [one]) if single is not None and single.num_rows == count else None
        out.extend(joined or [None])
    return out


def _join_or_none(
    table: pa.Table, counts: list[int], rows: list[memoryview]
) -> list[JoinedStream | _Unjoined | None] | None:
    """:func:`_join_table`, or None if it fails on columns of a shape it did not foresee: the streams then go
    to the exact reader, which explains what is wrong with them (a bulk join is never a reason to lose one)."""
    try:
        return _join_table(table, counts, rows)
    except Exception:  # any failure here only means "not in the bulk shape"
        return None


def _parse(rows: bytes) -> pa.Table | None:
    try:
        return pj.read_json(pa.BufferReader(rows), read_options=_READ, parse_options=_PARSE)
    except (pa.ArrowException, ValueError):
        return None


def _float_paths(type_: pa.DataType, path: str = "") -> list[str]:
    """Paths of the floating-point leaves of a (nested) Arrow type."""
    if pa.types.is_floating(type_):
        return [path]
    if pa.types.is_struct(type_):
        return [p for f in type_ for p in _float_paths(f.type, f"{path}.{f.name}")]
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return _float_paths(type_.value_type, f"{path}[]")
    return []


_DECLARED_FLOATS = frozenset(p for f in CHUNK_SCHEMA for p in _float_paths(f.type, f.name))


def _non_json_numbers(table: pa.Table, rows: list[memoryview]) -> np.ndarray:
    """``[streams]`` whether a stream may hold a ``NaN``/``Inf``/``Infinity`` literal in a field the join does
    not read (Arrow takes them all, the exact reader not all of them). Only a floating-point field can hold
    one, so the text is searched only when Arrow inferred such a field; declared logprobs are checked by
    value."""
    inferred = {p for f in table.schema for p in _float_paths(f.type, f.name)} - _DECLARED_FLOATS
    if not inferred:
        return np.zeros(len(rows), dtype=bool)
    texts = [bytes(r) for r in rows]
    return np.array([(b"NaN" in t or b"Inf" in t) and _NON_FINITE.search(t) is not None for t in texts])


def _flags(array: pa.Array) -> np.ndarray:
    """A boolean array (nulls as False) as numpy."""
    return pc.fill_null(array, False).to_numpy(zero_copy_only=False)


def _join_table(table: pa.Table, counts: list[int], rows: list[memoryview]) -> list[JoinedStream | _Unjoined | None]:
    table = table.combine_chunks()
    row_bounds = offsets_of(counts)
    ids = table.column("id").chunk(0)
    stream_ids = pc.take(ids, np.repeat(row_bounds[:-1], counts))  # each row's stream's first id
    other_id = _flags(pc.not_equal(ids, stream_ids)) | _flags(pc.is_null(stream_ids))
    apart = any_per_row(other_id, row_bounds) | _non_json_numbers(table, rows)
    bad_rows = ~_flags(pc.equal(table.column("object").chunk(0), CHAT_CHUNK))
    choice_lists = table.column("choices").chunk(0)
    per_row = pc.fill_null(pc.list_value_length(choice_lists), 0).to_numpy(zero_copy_only=False)
    bad_rows |= per_row > 1  # several choices: the exact join groups them by index
    choice_bounds = offsets_of(per_row)
    choices = pc.list_flatten(choice_lists)
    bad_choices = _choice_flags(choices)
    bad = any_per_row(bad_rows, row_bounds)
    bad |= any_per_row(bad_choices, choice_bounds[row_bounds])

    stream_choices = choice_bounds[row_bounds]  # [streams + 1] choice offsets
    prompts = _Lists(table.column("prompt_token_ids").chunk(0), row_bounds)
    choice_prompts = _Lists(pc.struct_field(choices, "prompt_token_ids"), stream_choices)
    token_ids = _Lists(pc.struct_field(choices, "token_ids"), stream_choices)
    contents = _Lists(pc.struct_field(pc.struct_field(choices, "logprobs"), "content"), stream_choices)
    contents.values = contents.values.cast(CHAT_CONTENT_ENTRY)  # without the keys the reader does not read
    finish = pc.struct_field(choices, "finish_reason")
    last_finish = _last_valid(_flags(pc.is_valid(finish)), stream_choices)
    finishes = pc.take(finish, np.maximum(last_finish, 0)).to_pylist() if len(finish) else []
    texts = pc.fill_null(pc.struct_field(pc.struct_field(choices, "delta"), "content"), "")
    offsets = pa.array(stream_choices, pa.int32())
    joined_texts = pc.binary_join(pa.ListArray.from_arrays(offsets, texts), "").to_pylist()

    out: list[JoinedStream | _Unjoined | None] = []
    for stream, (failed, separate) in enumerate(zip(bad.tolist(), apart.tolist())):
        if separate or failed:
            out.append(None if separate else UNJOINED)
            continue
        prompt = prompts.first(stream)
        if stream_choices[stream] == stream_choices[stream + 1]:
            out.append(JoinedStream(prompt, None))
            continue
        choice = JoinedChoice(
            token_ids=token_ids.joined(stream),
            content=contents.joined(stream),
            text=joined_texts[stream],
            finish_reason=finishes[stream] if last_finish[stream] >= 0 else None,
            prompt_token_ids=choice_prompts.first(stream),
        )
        out.append(JoinedStream(prompt, choice))
    return out


class _Lists:
    """A list array cut into consecutive segments (one per stream), with per-segment views of its values
    that need no compute call."""

    def __init__(self, lists: pa.ListArray, bounds: np.ndarray) -> None:
        valid = _flags(pc.is_valid(lists))
        self.offsets = offsets_of(pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False))
        self.values = pc.list_flatten(lists)  # null lists hold no values
        self.bounds = bounds
        self.present = any_per_row(valid, bounds)
        self.first_valid = _first_valid(valid, bounds)

    def joined(self, segment: int) -> pa.Array | None:
        """The segment's non-null lists joined in order; None when all are null."""
        if not self.present[segment]:
            return None
        start, stop = self.offsets[self.bounds[segment]], self.offsets[self.bounds[segment + 1]]
        return self.values.slice(int(start), int(stop - start))

    def first(self, segment: int) -> pa.Array | None:
        """The segment's first non-null list; None when all are null."""
        if not self.present[segment]:
            return None
        position = self.first_valid[segment]
        start, stop = self.offsets[position], self.offsets[position + 1]
        return self.values.slice(int(start), int(stop - start))


def _first_valid(valid: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``[segments]`` the position of the first True of ``valid`` in each segment (meaningless where none)."""
    positions = np.where(valid, np.arange(len(valid)), len(valid))
    following = np.minimum.accumulate(positions[::-1])[::-1]
    return np.append(following, len(valid))[bounds[:-1]]


def _last_valid(valid: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``[segments]`` the position of the last True of ``valid`` in each segment, −1 where none."""
    positions = np.where(valid, np.arange(len(valid)), -1)
    preceding = np.maximum.accumulate(positions) if len(positions) else positions
    last = np.insert(preceding, 0, -1)[bounds[1:]]
    return np.where(last >= bounds[:-1], last, -1)


def _choice_flags(choices: pa.StructArray) -> np.ndarray:
    """``[choices]`` True where a choice is outside the shape the bulk join reproduces exactly."""
    delta = pc.struct_field(choices, "delta")
    bad = ~_flags(pc.equal(pc.struct_field(choices, "index"), 0)) | _flags(pc.is_null(delta))
    bad |= _flags(pc.is_null(choices))
    logprobs = pc.struct_field(choices, "logprobs")
    contents = pc.struct_field(logprobs, "content")
    entries = pc.list_flatten(contents)
    if len(entries):
        entry_choice = pc.list_parent_indices(contents).to_numpy()
        heads = pc.struct_field(entries, "top_logprobs")
        head_entry = pc.list_parent_indices(heads).to_numpy()
        bad[entry_choice[~_exact(pc.struct_field(entries, "logprob"))]] = True
        bad[entry_choice[head_entry[~_exact(pc.struct_field(pc.list_flatten(heads), "logprob"))]]] = True
    return bad


def _exact(values: pa.Array) -> np.ndarray:
    """Per logprob: null, or finite and below 2⁵³ in magnitude (what both readers read alike)."""
    numbers = pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False)
    return np.abs(numbers) < _EXACT_LIMIT
