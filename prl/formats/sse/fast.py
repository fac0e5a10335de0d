"""The fast way to join a stream of ``chat.completion.chunk`` objects into one ``chat.completion`` response.

A stream carries one token per chunk, so a join that runs Python code per chunk is the bottleneck of SSE
ingest. :func:`join_chat_chunks` gathers each field of every chunk with C-level ``map``/``chain`` passes
(``dict.get`` over the whole list at once) and checks the types of what it gathered as a set, so a stream of
n chunks costs a few dozen passes over C-level iterators rather than n calls of a Python function.
:func:`join_chat_parts` does the same for chunks whose shared top-level fields were decoded once.

It accepts only streams in the common shape (every chunk an object of ``chat.completion.chunk``, no
``error``, choices that are objects with a non-negative integer ``index`` and an object ``delta``, ``token_ids``
and ``logprobs.content`` lists or null, ``logprobs`` an object or null) and returns None for anything else, so
that :func:`prl.formats.sse.exact.join_chunks` — the exact, per-chunk reader — joins it instead and explains what is
wrong. When it accepts a stream, its result equals ``join_chunks``'s (a property the tests check on generated
and mutated streams), so both paths give the same samples and the same quarantine reasons.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain, repeat
from typing import Any

import numpy as np

CHAT_CHUNK = "chat.completion.chunk"

_get = dict.get
_has = dict.__contains__
_NONE = type(None)
_LIST_OR_NONE = frozenset({list, _NONE})
_LEGACY_LOGPROB_KEYS = ("tokens", "token_logprobs", "top_logprobs")
"""Completions-style logprob lists: not used by a chat join, but the exact reader rejects non-list values."""


def join_chat_chunks(chunks: list[Any]) -> dict[str, Any] | None:
    """One ``chat.completion`` record from a complete stream's decoded chunks (in order), shaped exactly as
    :func:`prl.formats.sse.exact.join_chunks` shapes it (``_truncated``: choice indexes without a finish reason, in
    ascending order where ``join_chunks`` lists them as they first appear; readers use it as a set;
    ``_bad``: always empty here). None when the stream is not in the common shape."""
    if not chunks or set(map(type, chunks)) != {dict}:
        return None
    return join_chat_parts(chunks, list(map(_get, chunks, repeat("choices"))))


def join_chat_parts(heads: list[Any], choice_lists: list[Any]) -> dict[str, Any] | None:
    """:func:`join_chat_chunks` of chunks given as their top-level objects (``heads``; their own
    ``choices`` are not read) and their ``choices`` values, aligned; the first head names the record.
    Chunks that share their top-level fields may share one head object."""
    n = len(heads)
    if not heads or len(choice_lists) != n or set(map(type, heads)) != {dict}:
        return None
    # list.count, not a set: gathered values may be unhashable
    if list(map(_get, heads, repeat("object"))).count(CHAT_CHUNK) != n:
        return None
    if list(map(_get, heads, repeat("error"))).count(None) != n:
        return None
    if not set(map(type, choice_lists)) <= _LIST_OR_NONE:
        return None
    flat = list(chain.from_iterable(filter(None, choice_lists)))
    if flat and set(map(type, flat)) != {dict}:
        return None
    indexes = list(map(_get, flat, repeat("index"), repeat(0)))
    if indexes and (set(map(type, indexes)) != {int} or min(indexes) < 0):
        return None

    first = heads[0]
    record = {k: v for k, v in first.items() if k not in ("choices", "object", "usage")}
    record["object"] = "chat.completion"
    prompt = _first_present(list(map(_get, heads, repeat("prompt_token_ids"))))
    if prompt is not None:
        record["prompt_token_ids"] = prompt
    joined: list[dict[str, Any]] = []
    truncated: list[int] = []
    for index, group in _groups(flat, indexes):
        choice = _join_choice(index, group)
        if choice is None:
            return None
        joined.append(choice)
        if choice["finish_reason"] is None:
            truncated.append(index)
    record["choices"] = joined
    record["_truncated"] = truncated
    record["_bad"] = []
    return record


def _groups(flat: list[dict[str, Any]], indexes: list[int]) -> list[tuple[int, list[dict[str, Any]]]]:
    """Choices grouped by ``index`` (ascending), each group in stream order."""
    if not flat:
        return []
    if len(set(indexes)) == 1:
        return [(indexes[0], flat)]
    index_C = np.asarray(indexes, dtype=np.int64)
    order = np.argsort(index_C, kind="stable")
    values, starts = np.unique(index_C[order], return_index=True)
    bounds = [*starts.tolist(), len(order)]
    return [
        (int(value), list(map(flat.__getitem__, order[bounds[i] : bounds[i + 1]].tolist())))
        for i, value in enumerate(values.tolist())
    ]


def _join_choice(index: int, group: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One joined choice from its chunks' choice objects, or None when one is outside the common shape."""
    deltas = list(map(_get, group, repeat("delta")))
    if set(map(type, deltas)) != {dict}:
        return None
    # a choice's own token_ids win over the delta's, even when null (as in the exact reader)
    token_ids = _concat(map(_get, group, repeat("token_ids"), map(_get, deltas, repeat("token_ids"))))
    if token_ids is False:
        return None
    logprobs = list(map(_get, group, repeat("logprobs")))
    kinds = set(map(type, logprobs))
    if not kinds <= {dict, _NONE}:
        return None
    content: list[Any] | bool | None = None
    if dict in kinds:
        lp_dicts = list(filter(None, logprobs)) if _NONE in kinds else logprobs  # {} adds nothing either
        content = _concat(map(_get, lp_dicts, repeat("content")))
        if content is False or not _legacy_lists_ok(lp_dicts):
            return None
    texts = list(map(_get, deltas, repeat("content")))
    if set(map(type, texts)) <= {str, _NONE}:
        text = "".join(filter(None, texts))
    else:
        text = "".join([t for t in texts if isinstance(t, str)])
    out: dict[str, Any] = {
        "index": index,
        "finish_reason": _last_present(list(map(_get, group, repeat("finish_reason")))),
    }
    if token_ids is not None:
        out["token_ids"] = token_ids
    prompt = _first_present(list(map(_get, group, repeat("prompt_token_ids"))))
    if prompt is not None:
        out["prompt_token_ids"] = prompt
    out["message"] = {"role": "assistant", "content": text}
    if content is not None:
        out["logprobs"] = {"content": content}
    return out


def _legacy_lists_ok(lp_dicts: list[dict[str, Any]]) -> bool:
    """Whether the completions-style lists in chat ``logprobs`` objects are lists or null (the exact reader
    rejects anything else). Objects holding only ``content`` have none."""
    if set(map(len, lp_dicts)) == {1} and list(map(_has, lp_dicts, repeat("content"))).count(True) == len(lp_dicts):
        return True
    keys = set(chain.from_iterable(map(dict.keys, lp_dicts)))
    return all(
        set(map(type, map(_get, lp_dicts, repeat(key)))) <= _LIST_OR_NONE for key in _LEGACY_LOGPROB_KEYS if key in keys
    )


def _concat(values: Iterable[Any]) -> list[Any] | bool | None:
    """The lists among ``values`` joined in order; None when every value is null; False when one is neither
    a list nor null."""
    values = list(values)
    kinds = set(map(type, values))
    if not kinds <= _LIST_OR_NONE:
        return False
    if list not in kinds:
        return None
    return list(chain.from_iterable(filter(None, values)))


def _first_present(values: list[Any]) -> Any:
    """The first value that is not None (None when all are)."""
    if values.count(None) == len(values):
        return None
    return next(v for v in values if v is not None)


def _last_present(values: list[Any]) -> Any:
    """The last value that is not None (None when all are)."""
    if values.count(None) == len(values):
        return None
    return next(v for v in reversed(values) if v is not None)
