"""The ``traces`` rows of chat and text completions read by Arrow (:mod:`prl.ingestion.chat_block`), computed as
vectorized operations over the whole block: the reader's fields, validation and the digests. A record that
names a session, metadata, messages, a version or an agent (one the block marked) is also decoded, and the
chat reader reads those fields from it as the per-record road does (its token lists stay Arrow's).

A record is taken only where every step of the per-record road (the chat reader's ``parse``, the ingest
options, the scalar guard, batch validation) would keep all its choices and give exactly these values; a
record any step would quarantine, or read otherwise, is refused (``accepted`` false) and read by the
per-record road, which gives its rows or reasons as always. A record is refused where:

- it is not an ``object: "chat.completion"`` or ``"text_completion"``, has no string ``id`` (or an empty one,
  or one that looks derived), no choices;
- a choice has no prompt IDs where its reader takes them (a chat completion's top-level ``prompt_token_ids``;
  a text completion's own, else the record's);
- a choice is null, its ``index`` is beyond int32, its finish reason is unknown or missing (with no
  ``--finish-reason``), it has no ``token_ids`` list or no logprobs list (``logprobs.content`` of a chat
  completion, ``logprobs.token_logprobs`` of a text completion);
- a token list holds nulls, an ID outside [0, 2^31), is empty, or the logprob entries are not as many as the
  completion IDs; an entry is null, has a null token or a top-k head (whose rules ``parse`` applies);
- a chat completion's entry tokens are all ``"token_id:N"`` but not exactly the completion IDs so spelled, or
  a text completion's ``logprobs.tokens`` (as many as the IDs) begin so and are not all exactly those;
- a logprob is not finite, positive, a negative zero (Arrow reads the integer ``-0`` as -0.0, the decoders
  as 0), or at most -2^53 (an integer beyond 2^53 is exact for the decoders, not for a double);
- it is marked and its fields would not be kept as they are: another format claims it, or the chat reader,
  the run's options or the scalar guard would refuse a choice (a session that is not valid Unicode, a turn
  beyond int32, any value one of them raises on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prl.formats.base import TOKEN_ID_PREFIX, ParseOptions, Sample
from prl.formats.fields import DERIVED_ID_PREFIX, FINISH_REASON_MAP, MS_LIMIT, MS_THRESHOLD
from prl.ingestion.assemble import INT32_MAX
from prl.ingestion.batch import _digests, _Flat, _floored, _list
from prl.numerics.ragged import any_per_row, offsets_of
from prl.schema import TIMESTAMP_MS, TIMESTAMP_US, TRACES

CHAT_FORMAT = "openai_chat"
TEXT_FORMAT = "openai_completions"
CHAT_OBJECT = "chat.completion"
TEXT_OBJECT = "text_completion"
INT32_MIN = -(2**31)
EXACT_DOUBLE = 2.0**53
_REASONS = pa.array(list(FINISH_REASON_MAP))
_NORMALISED = pa.array(list(FINISH_REASON_MAP.values()))


@dataclass(slots=True)
class ChatRows:
    """What a block's table gave: ``accepted`` bool[T] per table row (record); ``batch``: the ``traces`` rows of
    the accepted records' choices, in order (``group_id`` and ``record_digest`` set); ``record`` int64[R]: the
    table row of each batch row."""

    accepted: np.ndarray
    batch: pa.RecordBatch
    record: np.ndarray


def _np(array: pa.Array, fill: object) -> np.ndarray:
    if array.null_count:
        array = pc.fill_null(array, fill)
    return array.to_numpy(zero_copy_only=False)


def _lengths(lists: pa.Array) -> np.ndarray:
    return _np(pc.list_value_length(lists), 0).astype(np.int64)


def _bad_ids(lists: pa.Array, lengths: np.ndarray) -> np.ndarray:
    """bool[rows]: lists holding a null or an ID outside [0, 2^31)."""
    values = pc.list_flatten(lists)
    ids = _np(values, -1)
    return any_per_row((ids < 0) | (ids > INT32_MAX), offsets_of(lengths))


def _column(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _created_us(created: pa.Array) -> pa.Array:
    """``timestamp_us`` of integer epoch seconds or milliseconds, vectorized (null where it gives None)."""
    value = _np(created, -1).astype(np.int64)
    us = value * np.where(value > MS_THRESHOLD, 1000, 1_000_000)  # epoch milliseconds, else seconds
    valid = np.asarray(created.is_valid()) & (value >= 0) & (value < MS_LIMIT)
    return pa.array(us, pa.int64(), mask=~valid).cast(TIMESTAMP_US)


def _records_ok(table: pa.Table, kinds: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(bool[T] records the road may take, bool[T] which of them are chat completions); ``kinds``: the
    ``object`` types the source's reader reads (a forced format reads every record as its own)."""
    ids = _column(table, "id")
    kind = _column(table, "object")
    chat = _np(pc.equal(kind, CHAT_OBJECT), False)
    ok = _np(pc.is_in(kind, value_set=pa.array(kinds, pa.string())), False)
    ok &= _np(pc.greater(pc.binary_length(ids), 0), False)
    ok &= ~_np(pc.starts_with(ids, DERIVED_ID_PREFIX), True)
    ok &= _lengths(_column(table, "choices")) > 0
    return ok, chat


def _listed(lists: pa.ListArray, name: str) -> pa.ListArray:
    """Field ``name`` of each list's structs, as lists of their own."""
    return pa.ListArray.from_arrays(lists.offsets, lists.values.field(name), mask=pc.invert(lists.is_valid()))


def _prefixed(lists: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(bool[C] lists whose every string is ``"token_id:N"``-prefixed, bool[C] lists whose first one is)."""
    lengths = _lengths(lists)
    prefixed = _np(pc.starts_with(pc.list_flatten(lists), TOKEN_ID_PREFIX), False)
    offsets = offsets_of(lengths)
    first = np.zeros(len(lengths), dtype=bool)
    first[lengths > 0] = prefixed[offsets[:-1][lengths > 0]]
    return ~any_per_row(~prefixed, offsets), first


def _spelled_wrong(tokens: pa.Array, ids: pa.Array, c_len: np.ndarray, ok: np.ndarray, chat: np.ndarray) -> np.ndarray:
    """bool[C]: choices whose spelled tokens the reader compares with the IDs and finds otherwise: a chat
    completion's where every entry token is ``"token_id:N"`` (as many as the IDs), a text completion's where
    the first is (every one must then be, and be the ID so spelled)."""
    t_len = _lengths(tokens)
    every, first = _prefixed(tokens)
    compared = ok & (t_len == c_len) & (c_len > 0) & np.where(chat, every, first)
    check = compared & every
    wrong = compared & ~every
    if not check.any():
        return wrong
    spelled = pc.list_flatten(tokens).filter(pa.array(np.repeat(check, t_len)))
    expected = pc.binary_join_element_wise(
        TOKEN_ID_PREFIX, pc.cast(pc.list_flatten(ids).filter(pa.array(np.repeat(check, c_len))), pa.string()), ""
    )
    differs = ~_np(pc.equal(spelled, expected), False)
    return wrong | (check & any_per_row(differs, offsets_of(np.where(check, t_len, 0))))


def chat_rows(
    table: pa.Table,
    lines: np.ndarray,
    marked: np.ndarray,
    samples_of: Callable[[int], list[Sample] | None],
    kinds: tuple[str, ...],
    options: ParseOptions,
    uri: str,
    now_ms: int,
) -> ChatRows:
    """The rows of the records of ``table`` (read with :data:`prl.ingestion.chat_block.CHAT_BLOCK_SCHEMA`;
    ``lines``: int64[T] their source line numbers) that the per-record road would keep as they are. The
    fields of a ``marked`` record beyond a bare response (session, turn, version, messages, agent) are those
    of the samples ``samples_of(row)`` reads from it; a record it gives None for, or samples that do not
    match its choices, is refused. ``kinds``: the ``object`` types the source's reader reads."""
    records = table.num_rows
    choices = _column(table, "choices")
    flat = pc.list_flatten(choices)
    parent = _np(pc.list_parent_indices(choices), 0).astype(np.int64)
    first = offsets_of(_lengths(choices))[:-1]
    accepted, chat_record = _records_ok(table, kinds)
    chat = chat_record[parent]
    ok = np.asarray(flat.is_valid()).copy()

    index = flat.field("index")
    given = np.asarray(index.is_valid())
    index_np = _np(index, 0)
    ok &= ~given | ((index_np >= INT32_MIN) & (index_np <= INT32_MAX))
    choice_index = np.where(given, index_np, np.arange(len(flat)) - first[parent]).astype(np.int32)

    reason = flat.field("finish_reason")
    found = pc.index_in(reason, value_set=_REASONS)
    finish = pc.take(_NORMALISED, found)
    if options.finish_reason is not None:
        finish = pc.if_else(reason.is_valid(), finish, options.finish_reason)
    ok &= np.asarray(finish.is_valid())

    top_prompt = pc.take(_column(table, "prompt_token_ids"), pa.array(parent))
    own_prompt = flat.field("prompt_token_ids")  # a text completion's, where it has one
    prompts = pc.if_else(pa.array(chat | ~np.asarray(own_prompt.is_valid())), top_prompt, own_prompt)
    p_len = _lengths(prompts)
    ok &= np.asarray(prompts.is_valid()) & (p_len > 0) & ~_bad_ids(prompts, p_len)
    ids = flat.field("token_ids")
    c_len = _lengths(ids)
    ok &= np.asarray(ids.is_valid()) & (c_len > 0) & ~_bad_ids(ids, c_len)

    logprobs = flat.field("logprobs")
    content = logprobs.field("content")
    entries = pc.list_flatten(content)
    odd = ~np.asarray(entries.is_valid()) | ~np.asarray(entries.field("token").is_valid())
    odd |= _np(pc.list_value_length(entries.field("top_logprobs")), 0) > 0  # heads: the chat reader's rules
    ok &= ~(chat & any_per_row(odd, offsets_of(_lengths(content))))
    is_chat = pa.array(chat)
    value_lists = pc.if_else(is_chat, _listed(content, "logprob"), logprobs.field("token_logprobs"))
    token_lists = pc.if_else(is_chat, _listed(content, "token"), logprobs.field("tokens"))
    t_len = _lengths(value_lists)
    ok &= np.asarray(logprobs.is_valid()) & np.asarray(value_lists.is_valid()) & (t_len == c_len)
    values = pc.list_flatten(value_lists)
    lp = _np(values, -1.0)
    odd = ~np.isfinite(lp) | (lp > 0) | (lp <= -EXACT_DOUBLE) | ((lp == 0) & np.signbit(lp))
    ok &= ~any_per_row(odd, offsets_of(t_len))
    ok &= ~_spelled_wrong(token_lists, ids, c_len, ok, chat)

    accepted &= np.bincount(parent[~ok], minlength=records)[:records] == 0
    fields = _marked_samples(accepted, marked, first, choice_index, samples_of)
    keep = accepted[parent]
    record = parent[keep]
    kept = pa.array(keep)
    message = flat.field("message")
    text = pc.if_else(message.is_valid(), message.field("content"), pa.scalar(None, pa.string()))
    columns = {
        "choice_index": pa.array(choice_index[keep], pa.int32()),
        "finish_reason": finish.filter(kept),
        "completion_text": pc.if_else(is_chat, text, flat.field("text")).filter(kept),
        "source_format": pc.if_else(is_chat, CHAT_FORMAT, TEXT_FORMAT).filter(kept),
    }
    if fields:
        columns |= _field_columns(fields, record, first, choice_index, keep, options)
    batch = _assemble(
        table, columns, record, prompts.filter(kept), (ids, c_len), (values, t_len), keep, lines, options, uri, now_ms
    )
    return ChatRows(accepted, batch, record)


RECORD_FIELDS = {"session_id": pa.string(), "turn": pa.int32(), "agent_id": pa.string(), "messages": pa.string()}
"""Sample fields a marked record may set, besides ``policy_version``, with their column types."""


def _marked_samples(
    accepted: np.ndarray,
    marked: np.ndarray,
    first: np.ndarray,
    choice_index: np.ndarray,
    samples_of: Callable[[int], list[Sample] | None],
) -> dict[int, list[Sample]]:
    """The samples of the accepted marked records, by table row; a record whose samples are None or are not
    its choices (their count and indices) is no longer accepted."""
    fields: dict[int, list[Sample]] = {}
    ends = np.r_[first[1:], len(choice_index)] if len(first) else first
    for row in np.flatnonzero(accepted & marked).tolist():
        samples = samples_of(row)
        indices = choice_index[first[row] : ends[row]].tolist()
        if samples is None or [sample.choice_index for sample in samples] != indices:
            accepted[row] = False
        else:
            fields[row] = samples
    return fields


def _field_columns(
    fields: dict[int, list[Sample]],
    record: np.ndarray,
    first: np.ndarray,
    choice_index: np.ndarray,
    keep: np.ndarray,
    options: ParseOptions,
) -> dict[str, pa.Array]:
    """The kept rows' session, turn, agent, messages and version columns: a marked record's from its
    samples, every other row's as a bare response has them."""
    position = (np.flatnonzero(keep) - first[record]).tolist()  # each kept row's place among its choices
    samples = [fields.get(row) for row in record.tolist()]
    picked = [None if found is None else found[k] for found, k in zip(samples, position, strict=True)]
    columns = {
        name: pa.array([None if s is None else getattr(s, name) for s in picked], kind)
        for name, kind in RECORD_FIELDS.items()
    }
    columns["policy_version"] = pa.array(
        [options.policy_version if s is None else s.policy_version for s in picked], pa.string()
    )
    return columns


def _assemble(
    table: pa.Table,
    columns: dict[str, pa.Array],
    record: np.ndarray,
    prompt_lists: pa.Array,
    ids: tuple[pa.Array, np.ndarray],
    logprobs: tuple[pa.Array, np.ndarray],
    keep: np.ndarray,
    lines: np.ndarray,
    options: ParseOptions,
    uri: str,
    now_ms: int,
) -> pa.RecordBatch:
    """The traces batch of the kept choices (``record``: their table rows; ``prompt_lists``: their prompts), as
    :func:`prl.ingestion.batch.check_and_assemble` builds it."""
    rows = len(record)
    take = pa.array(record)
    prompt_len = _lengths(prompt_lists)
    prompt = _Flat(offsets_of(prompt_len), pc.list_flatten(prompt_lists), None)
    id_lists, c_len = ids
    completion = _Flat(
        offsets_of(c_len[keep]), pc.list_flatten(id_lists).filter(pa.array(np.repeat(keep, c_len))), None
    )
    values, t_len = logprobs
    floored = _floored(values.filter(pa.array(np.repeat(keep, t_len))))
    lp = _Flat(offsets_of(t_len[keep]), floored, None)
    lp32 = floored.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    digests, prompt_digests = _digests(
        {"prompt": prompt, "completion": completion, "logprobs": lp}, lp32, np.arange(rows)
    )
    request_id = pc.take(_column(table, "id"), take)
    columns |= {
        "sample_id": pc.binary_join_element_wise(request_id, pc.cast(columns["choice_index"], pa.string()), "#"),
        "request_id": request_id,
        "group_id": pa.array(prompt_digests, pa.string()),
        "policy_version": columns.get("policy_version", pa.array([options.policy_version] * rows, pa.string())),
        "model": pc.take(_column(table, "model"), take),
        "created_at": pc.take(_created_us(_column(table, "created")), take),
        "prompt_token_ids": _list(prompt, prompt.values.cast(pa.int32(), safe=False)),
        "completion_token_ids": _list(completion, completion.values.cast(pa.int32(), safe=False)),
        "completion_logprobs": _list(lp, floored),
        "record_digest": pa.array(digests, pa.string()),
        "source_uri": pa.array([uri] * rows, pa.string()),
        "source_line": pa.array(lines[record], pa.int64()),
        "ingested_at": pa.array(np.full(rows, now_ms, dtype=np.int64)).cast(TIMESTAMP_MS),
    }
    arrays = [columns[f.name] if f.name in columns else pa.nulls(rows, f.type) for f in TRACES]
    return pa.RecordBatch.from_arrays(arrays, schema=TRACES)


__all__ = ["CHAT_FORMAT", "CHAT_OBJECT", "TEXT_FORMAT", "TEXT_OBJECT", "ChatRows", "chat_rows"]
