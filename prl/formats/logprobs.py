"""The three ways servers spell per-token logprobs, each turned into Arrow columns in a handful of C++ calls:

* OpenAI chat ``logprobs.content``: ``[{token | token_id, logprob, top_logprobs: [{token | token_id,
  logprob}]}]`` (vLLM chat, vLLM ``/inference/v1/generate``, SGLang's OpenAI server, stream chunks);
* OpenAI legacy completions ``logprobs``: ``{tokens, token_logprobs, top_logprobs: [{token: logprob}]}``;
* vLLM ``RequestOutput`` dicts: ``[{"<id>": {logprob, rank, decoded_token}}]`` per position, holding the
  sampled token and the top k (k + 1 entries when the sampled token ranked below k).

Each returns a :class:`TokenColumns`. Heads come out ordered highest logprob first, with the extra sampled
entry removed, so every position holds the sampler's exact top k: completions dicts that hold k + 1 entries
at every position lose their sampled entry too (:func:`prl.formats.base.extra_sampled_everywhere`), and chat
lists in vLLM's sampled-first order keep the exact top k - 1 (:func:`prl.formats.base.exact_chat_heads`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prl.formats.base import (
    TOKEN_ID_PREFIX,
    Quarantined,
    as_float64,
    drop_extra_sampled,
    extra_sampled_everywhere,
    keep_best,
    logprob_array,
    parse_token_id_strings,
    reject_booleans,
    reject_head_booleans,
    reject_nested_booleans,
    require_map_entries,
    sampled_first_heads,
    sort_heads_descending,
)


@dataclass(slots=True)
class TokenColumns:
    """Per-token columns of one choice. ``ids``: int64 sampled IDs when the logprobs spell them (None when
    they hold token text); ``logprobs``: float64, null where absent; ``topk_*``: ``[positions][k]`` list
    arrays (int64 / float64), or None when the server sent no heads."""

    ids: pa.Array | None
    logprobs: pa.Array
    topk_ids: pa.ListArray | None = None
    topk_logprobs: pa.ListArray | None = None

    @classmethod
    def empty(cls) -> TokenColumns:
        return cls(pa.array([], pa.int64()), pa.array([], pa.float64()))


# --- struct plumbing -----------------------------------------------------------------------------------


def struct_rows(values: Any, what: str, reason: str = "bad_logprob") -> pa.StructArray:
    """A JSON list of objects as one StructArray, types inferred in one C++ pass (inference, unlike a
    declared int type, never truncates ``1.5`` to ``1``; field types are checked afterwards)."""
    if not isinstance(values, list):
        raise Quarantined(reason, f"{what} is {type(values).__name__}, expected a list of objects")
    try:
        rows = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise Quarantined(reason, f"{what} has an unexpected shape: {exc}") from None
    if pa.types.is_null(rows.type):
        if rows.null_count:
            raise Quarantined(reason, f"{what} has null entries")
        return pa.array([], pa.struct([]))
    if not pa.types.is_struct(rows.type):
        raise Quarantined(reason, f"{what} holds {rows.type} values, expected objects")
    if rows.null_count:
        raise Quarantined(reason, f"{what} has null entries")
    return rows


def field(rows: pa.StructArray, name: str) -> pa.Array | None:
    """Field ``name`` of a StructArray (None when no row has it, or every row holds null)."""
    index = rows.type.get_field_index(name)
    if index < 0:
        return None
    values = rows.field(index)
    if pa.types.is_null(values.type):
        return None
    return values


def int_field(rows: pa.StructArray, name: str, what: str) -> pa.Array | None:
    """An integer ID field as int64, or None when absent; nulls or non-integers are ``bad_token_id``."""
    values = field(rows, name)
    if values is None:
        return None
    if not pa.types.is_integer(values.type):
        raise Quarantined("bad_token_id", f"{what}.{name} holds {values.type} values, expected integers")
    if values.null_count:
        raise Quarantined("bad_token_id", f"{what}.{name} has null entries")
    return values.cast(pa.int64())


def float_field(rows: pa.StructArray, name: str, what: str) -> pa.Array:
    """A logprob field as float64 (nulls kept; all-null when absent); other types are ``bad_logprob``."""
    values = field(rows, name)
    if values is None:
        return pa.nulls(len(rows), pa.float64())
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
        return as_float64(values, f"{what}.{name}")
    raise Quarantined("bad_logprob", f"{what}.{name} holds {values.type} values, expected numbers")


def token_ids_of(rows: pa.StructArray, what: str) -> pa.Array | None:
    """IDs from ``token_id`` (ints) or ``token`` (``"token_id:N"``); None when the tokens are text."""
    ids = int_field(rows, "token_id", what)
    if ids is not None:
        return ids
    tokens = field(rows, "token")
    if tokens is None or not pa.types.is_string(tokens.type) or tokens.null_count:
        return None
    if len(tokens) and not pc.all(pc.starts_with(tokens, TOKEN_ID_PREFIX)).as_py():
        return None
    return parse_token_id_strings(tokens, f"{what}.token")


def list_offsets(lists: pa.Array) -> np.ndarray:
    """int32 offsets of a list (or map) array, treating null lists as empty."""
    lengths = np.diff(np.asarray(lists.offsets.to_numpy(), dtype=np.int64))
    if lists.null_count:
        lengths = np.where(np.asarray(lists.is_valid()), lengths, 0)
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def list_values(lists: pa.Array) -> pa.Array:
    """The child values of a list array, null lists skipped (aligned with :func:`list_offsets`)."""
    return lists.flatten()


# --- heads ---------------------------------------------------------------------------------------------


def build_heads(
    offsets: np.ndarray,
    head_ids: pa.Array,
    head_logprobs: pa.Array,
    sampled_ids: pa.Array | None,
    what: str,
    k: int | None = None,
) -> tuple[pa.ListArray | None, pa.ListArray | None]:
    """``[positions][k]`` heads from flat entries and offsets: ordered by logprob, highest first, with the
    sampled token's extra entry dropped where a position holds k + 1 (``k`` defaults to the smallest non-empty
    head).
    No entries at all means no heads (None, None)."""
    if len(head_ids) == 0:
        return None, None
    positions = len(offsets) - 1
    if sampled_ids is not None and positions != len(sampled_ids):
        raise Quarantined(
            "topk_length_mismatch",
            f"{what} has heads for {positions} positions but {len(sampled_ids)} tokens",
        )
    offsets_array = pa.array(offsets, pa.int32())
    ids = pa.ListArray.from_arrays(offsets_array, head_ids)
    lps = pa.ListArray.from_arrays(offsets_array, head_logprobs)
    ids, lps = sort_heads_descending(ids, lps)
    if k is None:
        sizes = np.diff(offsets)
        k = int(sizes[sizes > 0].min())
    if sampled_ids is not None:
        ids, lps = drop_extra_sampled(ids, lps, sampled_ids, k)
    return ids, lps


# --- the three shapes ----------------------------------------------------------------------------------


def content_logprobs(content: Any, what: str, sampled_ids: pa.Array | None = None) -> TokenColumns:
    """OpenAI chat-style ``logprobs.content`` entries → columns. ``sampled_ids`` (from the choice's own
    ``token_ids``) take precedence over IDs spelled in the entries for aligning heads."""
    reject_booleans(content, what, "logprob")
    reject_head_booleans(content, what)
    rows = struct_rows(content, what)
    if len(rows) == 0:
        return TokenColumns.empty()
    ids = token_ids_of(rows, what)
    logprobs = float_field(rows, "logprob", what)
    heads = field(rows, "top_logprobs")
    columns = TokenColumns(ids, logprobs)
    if heads is None or (pa.types.is_list(heads.type) and pa.types.is_null(heads.type.value_type)):
        return columns  # no heads, or only empty ones
    if not pa.types.is_list(heads.type) or not pa.types.is_struct(heads.type.value_type):
        raise Quarantined("bad_logprob", f"{what}.top_logprobs holds {heads.type}, expected lists of objects")
    entries = list_values(heads)
    if entries.null_count:
        raise Quarantined("bad_logprob", f"{what}.top_logprobs has null entries")
    head_ids = token_ids_of(entries, f"{what}.top_logprobs")
    if head_ids is None:
        return columns  # heads spelled as text: unusable without retokenizing, so not kept
    offsets = list_offsets(heads)
    head_logprobs = float_field(entries, "logprob", f"{what}.top_logprobs")
    sampled = sampled_ids if sampled_ids is not None else ids
    columns.topk_ids, columns.topk_logprobs = build_heads(offsets, head_ids, head_logprobs, sampled, what)
    if sampled is not None and columns.topk_ids is not None and len(sampled) == len(offsets) - 1:
        as_lists = pa.array(offsets, pa.int32())
        first, unsorted = sampled_first_heads(
            pa.ListArray.from_arrays(as_lists, head_ids), pa.ListArray.from_arrays(as_lists, head_logprobs), sampled
        )
        if first and unsorted:  # vLLM's sampled-first lists: the exact top k - 1 (see exact_chat_heads)
            k = int(np.diff(offsets).min()) - 1
            if k <= 0:
                columns.topk_ids = columns.topk_logprobs = None
            else:
                columns.topk_ids, columns.topk_logprobs = keep_best(columns.topk_ids, columns.topk_logprobs, k)
    return columns


_HEAD_MAP = pa.map_(pa.string(), pa.float64())


def completions_logprobs(logprobs: Any, what: str, sampled_ids: pa.Array | None = None) -> TokenColumns:
    """OpenAI legacy completions ``logprobs`` object → columns (IDs from ``"token_id:N"`` tokens)."""
    if not isinstance(logprobs, dict):
        raise Quarantined("bad_logprob", f"{what} is {type(logprobs).__name__}, expected an object")
    ids = None
    tokens = logprobs.get("tokens")
    if isinstance(tokens, list) and tokens:
        try:
            strings = pa.array(tokens)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise Quarantined("bad_logprob", f"{what}.tokens is not a list of strings: {exc}") from None
        if (
            pa.types.is_string(strings.type)
            and strings.null_count == 0
            and pc.all(pc.starts_with(strings, TOKEN_ID_PREFIX)).as_py()
        ):
            ids = parse_token_id_strings(strings, f"{what}.tokens")
    lps = logprob_array(logprobs.get("token_logprobs", []), f"{what}.token_logprobs")
    columns = TokenColumns(ids, lps)
    top = logprobs.get("top_logprobs")
    if top is None:
        return columns
    if not isinstance(top, list):
        raise Quarantined("bad_logprob", f"{what}.top_logprobs is {type(top).__name__}, expected a list")
    require_map_entries(top, "bad_logprob", f"{what}.top_logprobs")
    reject_nested_booleans(top, f"{what}.top_logprobs")
    try:
        heads = pa.array(top, type=_HEAD_MAP)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise Quarantined("bad_logprob", f"{what}.top_logprobs has an unexpected shape: {exc}") from None
    keys = heads.keys
    if len(keys) and not pc.all(pc.starts_with(keys, TOKEN_ID_PREFIX)).as_py():
        return columns  # heads keyed by token text: not kept
    offsets = list_offsets(heads)
    head_ids = parse_token_id_strings(keys, f"{what}.top_logprobs")
    sampled = sampled_ids if sampled_ids is not None else ids
    k = None
    if sampled is not None and len(head_ids) and len(sampled) == len(offsets) - 1:
        as_lists = pa.array(offsets, pa.int32())
        if extra_sampled_everywhere(
            pa.ListArray.from_arrays(as_lists, head_ids), pa.ListArray.from_arrays(as_lists, heads.items), sampled
        ):
            k = int(offsets[1] - offsets[0]) - 1  # k + 1 entries at every position
    columns.topk_ids, columns.topk_logprobs = build_heads(offsets, head_ids, heads.items, sampled, what, k=k)
    return columns


_RANKED = pa.map_(pa.string(), pa.struct([("logprob", pa.float64()), ("rank", pa.float64())]))
_PLAIN = pa.map_(pa.string(), pa.float64())


def dict_logprobs(entries: Any, sampled_ids: pa.Array, what: str) -> TokenColumns:
    """vLLM ``RequestOutput``-style logprobs: one ``{"<token id>": {logprob, rank, decoded_token}}`` dict
    (or ``{"<id>": logprob}``) per position, holding the sampled token and the top k. The sampled token's
    logprob is looked up by its ID (null where the dict lacks it); heads hold the top k.

    k is the smallest dict size, except when every dict has the same size s and some sampled token ranks
    below s: then every dict is the top s - 1 plus the sampled token (``rank`` tells the two apart)."""
    if not isinstance(entries, list):
        raise Quarantined("bad_logprob", f"{what} is {type(entries).__name__}, expected a list of dicts")
    if len(entries) != len(sampled_ids):
        raise Quarantined(
            "length_mismatch", f"{what} has {len(entries)} positions but there are {len(sampled_ids)} tokens"
        )
    if not entries:
        return TokenColumns.empty()
    ranks = None
    require_map_entries(entries, "bad_logprob", what)
    values = list(chain.from_iterable(map(dict.values, filter(None, entries))))
    reject_booleans(values, what)
    reject_booleans(values, what, "logprob")
    try:
        maps = pa.array(entries, type=_RANKED)
        values = maps.items
        logprobs_flat, ranks = values.field(0), values.field(1)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        try:
            maps = pa.array(entries, type=_PLAIN)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise Quarantined("bad_logprob", f"{what} has an unexpected shape: {exc}") from None
        logprobs_flat = maps.items
    keys = maps.keys
    if len(keys) and pc.all(pc.starts_with(keys, TOKEN_ID_PREFIX)).as_py():
        keys = pc.utf8_slice_codeunits(keys, len(TOKEN_ID_PREFIX))
    try:
        key_ids = pc.cast(keys, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise Quarantined("bad_token_id", f"{what} has keys that are not token IDs") from None

    positions = len(entries)
    offsets = list_offsets(maps)
    sizes = np.diff(offsets)
    parents = np.repeat(np.arange(positions), sizes)
    sampled_np = np.asarray(sampled_ids.to_numpy(zero_copy_only=False), dtype=np.int64)
    is_sampled = np.asarray(key_ids.to_numpy(zero_copy_only=False), dtype=np.int64) == sampled_np[parents]
    lp_np = np.asarray(logprobs_flat.to_numpy(zero_copy_only=False), dtype=np.float64)
    found = np.zeros(positions, dtype=bool)
    sampled_lp = np.zeros(positions, dtype=np.float64)
    found[parents[is_sampled]] = True
    sampled_lp[parents[is_sampled]] = lp_np[is_sampled]
    sampled_lp_valid = found.copy()
    if logprobs_flat.null_count:
        lp_valid = np.asarray(logprobs_flat.is_valid())
        sampled_lp_valid[parents[is_sampled & ~lp_valid]] = False
    columns = TokenColumns(sampled_ids, pa.array(sampled_lp, pa.float64(), mask=~sampled_lp_valid))

    k = int(sizes.min()) if positions else 0
    if ranks is not None and positions and (sizes == k).all() and ranks.null_count == 0:
        rank_np = np.asarray(ranks.to_numpy(zero_copy_only=False))
        if (rank_np[is_sampled] > k).any():
            k -= 1
    if k <= 0:
        return columns
    columns.topk_ids, columns.topk_logprobs = build_heads(offsets, key_ids, logprobs_flat, sampled_ids, what, k=k)
    return columns
