"""OpenAI-style responses that carry token IDs: vLLM ``/v1/chat/completions`` and ``/v1/completions``, and the
same shape from SGLang's OpenAI-compatible server, NeMo and LiteLLM.

Where the IDs come from:
- chat prompt: top-level ``prompt_token_ids`` (vLLM ≥ 0.10.2 ``return_token_ids``) or per choice (SGLang);
- chat completion: ``choices[i].token_ids``, ``provider_specific_fields.token_ids`` (LiteLLM),
  ``message.generation_token_ids`` (NeMo), else ``"token_id:N"`` in ``logprobs.content[].token``
  (``return_tokens_as_token_ids``);
- completions: choice ``prompt_token_ids`` / ``token_ids``, else ``"token_id:N"`` in ``logprobs.tokens``;
- logprobs: ``logprobs.content[].logprob`` (chat), ``logprobs.token_logprobs`` (completions);
- top-k head: ``top_logprobs`` lists (chat) or dicts (completions), each head ordered by logprob, highest first,
  and exact: vLLM's chat lists start with the sampled token (the first k entries of a dict that holds it first),
  so a response whose every head starts with the sampled token and some head is unsorted keeps the exact top
  k - 1 of every head (:func:`prl.formats.base.exact_chat_heads`); completions dicts hold k + 1 entries where the
  sampled token ranks below k, and the extra sampled entry is removed, at some positions or at all of them
  (:func:`prl.formats.base.extra_sampled_everywhere`), with one k for the whole response.
- policy version: ``metadata.weight_version`` or ``sglext.weight_version``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from prl.formats.base import (
    Format,
    ParseOptions,
    Quarantined,
    Sample,
    drop_extra_sampled,
    exact_chat_heads,
    extra_sampled_everywhere,
    logprob_array,
    parse_token_id_strings,
    reject_booleans,
    reject_head_booleans,
    reject_nested_booleans,
    sort_heads_descending,
    token_id_array,
    typed_array,
)
from prl.formats.fields import (
    DERIVED_ID_PREFIX,
    as_dict,
    as_list,
    finish_reason,
    group_key_of,
    messages_of,
    metadata_of,
    opt_int,
    policy_version_of,
    session_of,
    timestamp_us,
)

HEAD_ENTRY = pa.struct([("token", pa.string()), ("logprob", pa.float64())])
CHAT_CONTENT_ENTRY = pa.struct(
    [("token", pa.string()), ("logprob", pa.float64()), ("top_logprobs", pa.list_(HEAD_ENTRY))]
)
HEAD_MAP = pa.map_(pa.string(), pa.float64())
NO_IDS = pa.array([], pa.int64())
NO_LOGPROBS = pa.array([], pa.float64())
"""Placeholders for the token arrays of a sample :meth:`_OpenAIReader.scalars` reads (read elsewhere)."""


def _version_candidates(obj: dict[str, Any], choice: dict[str, Any]) -> list[Any]:
    sglext = obj.get("sglext")
    meta = metadata_of(obj)
    return [
        choice.get("weight_version"),
        meta.get("weight_version"),
        sglext.get("weight_version") if isinstance(sglext, dict) else None,
        obj.get("weight_version"),
        meta.get("policy_version"),
        obj.get("policy_version"),
    ]


def _heads_from_entries(entries: pa.ListArray) -> tuple[pa.ListArray | None, pa.ListArray | None]:
    """``[positions][k]`` head IDs and logprobs from ``top_logprobs`` lists of {token, logprob}.
    None when no position has a head or when the head tokens are text rather than ``token_id:N``."""
    if len(entries) == 0 or pc.sum(pc.list_value_length(entries)).as_py() in (0, None):
        return None, None
    flat = pc.list_flatten(entries)
    tokens = pc.struct_field(flat, "token")
    if tokens.null_count or not pc.all(pc.starts_with(tokens, "token_id:")).as_py():
        return None, None
    offsets = entries.offsets
    if len(offsets) and offsets[0].as_py():  # a slice of a longer array: offsets into its values
        offsets = pc.subtract(offsets, offsets[0])
    ids = parse_token_id_strings(tokens, "top_logprobs token")
    return (
        pa.ListArray.from_arrays(offsets, ids),
        pa.ListArray.from_arrays(offsets, pc.struct_field(flat, "logprob")),
    )


def _check_same(ids: pa.Array, other: pa.Array, what: str) -> None:
    if len(ids) != len(other) or not pc.all(pc.equal(ids, other)).as_py():
        raise Quarantined("token_mismatch", f"{what} disagree with the completion token_ids")


class _OpenAIReader(Format):
    """The choice loop both OpenAI-style readers share: one Sample (or Quarantined) per choice."""

    object_type: ClassVar[str] = ""

    def detect(self, obj: Any) -> bool:
        return isinstance(obj, dict) and obj.get("object") == self.object_type and "choices" in obj

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        request_id = obj.get("id")
        if not isinstance(request_id, str) or not request_id:
            raise Quarantined("missing_request_id", f"{self.object_type} without an 'id'")
        choices = as_list(obj.get("choices"), "choices")
        if not choices:
            raise Quarantined("no_choices", f"{self.object_type} with an empty 'choices' list")
        out: list[Sample | Quarantined] = []
        for position, choice in enumerate(choices):
            index = opt_int(choice.get("index")) if isinstance(choice, dict) else None
            index = position if index is None else index
            try:
                out.append(self._choice(obj, request_id, index, as_dict(choice, "choice"), options))
            except Quarantined as q:
                q.choice_index = index
                out.append(q)
        return out

    def _choice(
        self, obj: dict[str, Any], request_id: str, index: int, choice: dict[str, Any], options: ParseOptions
    ) -> Sample:
        raise NotImplementedError

    def scalars(self, obj: Any, options: ParseOptions) -> list[Sample] | None:
        """:meth:`parse`'s samples of a record whose token columns are read elsewhere (the columnar road of
        ingest), every field but the token arrays set (those are placeholders); None where ``parse`` would
        read it otherwise: no ID or one that looks derived, no choices, a choice that is not an object or
        whose fields ``parse`` would refuse."""
        request_id, choices = _scalar_header(obj)
        if request_id is None:
            return None
        out: list[Sample] = []
        for position, choice in enumerate(choices):
            if type(choice) is not dict:
                return None
            index = opt_int(choice.get("index"))
            index = position if index is None else index
            sample = _scalar_sample(obj, request_id, index, choice, self._text(choice), options)
            if sample is None:
                return None
            out.append(sample)
        return out

    @staticmethod
    def _text(choice: dict[str, Any]) -> Any:
        """The choice's text as the record holds it."""
        return choice.get("text")


def _record_fields(sample: Sample, obj: dict[str, Any], choice: dict[str, Any], options: ParseOptions) -> Sample:
    """Set the sample fields that come from the record rather than the tokens: session, group, version, model,
    time, messages."""
    bare = obj.keys().isdisjoint(_OPTIONAL_KEYS)  # then the lookups skipped below give None (and the choice's version)
    if not bare:
        sample.session_id, sample.turn = session_of(obj)
    sample.group_key = group_key_of(obj, options)
    candidates = [choice.get("weight_version")] if bare else _version_candidates(obj, choice)
    sample.policy_version = policy_version_of(*candidates, options=options)
    model = obj.get("model")
    sample.model = model if isinstance(model, str) else None
    sample.created_at_us = timestamp_us(obj.get("created"))
    if not bare:
        sample.messages = messages_of(obj)
    return sample


_OPTIONAL_KEYS = frozenset({"session_id", "turn", "metadata", "sglext", "weight_version", "policy_version", "messages"})
"""Record keys :func:`session_of`, :func:`_version_candidates` and :func:`messages_of` read: servers'
responses carry none of them, and then session, turn and messages are None and the version is the choice's."""


def _scalar_header(obj: Any) -> tuple[str | None, list[Any]]:
    """The request ID and choices of a record :meth:`_OpenAIReader.scalars` reads (None, [] for one ``parse``
    must read: no ID, an ID that looks derived, which read_record salts by position, or no choices)."""
    request_id = obj.get("id") if type(obj) is dict else None
    choices = obj.get("choices") if type(obj) is dict else None
    if type(request_id) is not str or not request_id or request_id.startswith(DERIVED_ID_PREFIX):
        return None, []
    if type(choices) is not list or not choices:
        return None, []
    return request_id, choices


def _scalar_sample(
    obj: dict[str, Any], request_id: str, index: int, choice: dict[str, Any], text: Any, options: ParseOptions
) -> Sample | None:
    """A choice's sample with its token arrays left as placeholders, or None where ``parse`` would raise."""
    try:
        sample = Sample(request_id, index, NO_IDS, NO_IDS, NO_LOGPROBS, finish_reason(choice.get("finish_reason")))
        sample.completion_text = text if type(text) is str else None
        return _record_fields(sample, obj, choice, options)
    except Exception:  # whatever parse would quarantine the record for, parse says
        return None


def _refuse_without_prompt(choice: dict[str, Any]) -> None:
    """A chat choice without prompt IDs: ``no_prompt_ids`` when it carries its completion IDs as
    ``logprobs.token_ids`` beside ``logprobs.token_logprobs`` (Together's ``LogprobsPart``; they are read, so
    that malformed ones say so), else ``no_token_ids``."""
    logprobs = choice.get("logprobs")
    ids_raw = logprobs.get("token_ids") if isinstance(logprobs, dict) else None
    if ids_raw is None:
        raise Quarantined("no_token_ids", "no prompt_token_ids (start vLLM with return_token_ids)")
    ids = token_id_array(ids_raw, "logprobs.token_ids")
    values = logprob_array(logprobs.get("token_logprobs", []), "logprobs.token_logprobs")  # type: ignore[union-attr]
    if len(values) != len(ids):
        raise Quarantined(
            "length_mismatch", f"logprobs.token_ids has {len(ids)} entries, logprobs.token_logprobs {len(values)}"
        )
    raise Quarantined(
        "no_prompt_ids",
        f"the completion's {len(ids)} token IDs are in logprobs.token_ids, but the response has no prompt IDs: "
        "a sample needs the IDs the model was conditioned on (log the request's prompt IDs beside it)",
    )


class VllmChat(_OpenAIReader):
    name = "openai_chat"
    description = "OpenAI-style chat.completion with token IDs (vLLM, SGLang, NeMo, LiteLLM)"
    object_type = "chat.completion"

    def _choice(
        self, obj: dict[str, Any], request_id: str, index: int, choice: dict[str, Any], options: ParseOptions
    ) -> Sample:
        top_prompt = obj.get("prompt_token_ids")
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        prompt_raw = top_prompt if top_prompt is not None else choice.get("prompt_token_ids")
        if prompt_raw is None:
            _refuse_without_prompt(choice)
        prompt = token_id_array(prompt_raw, "prompt_token_ids")
        psf = choice.get("provider_specific_fields")
        ids_raw = choice.get("token_ids")
        if ids_raw is None and isinstance(psf, dict):
            ids_raw = psf.get("token_ids")
        if ids_raw is None:
            ids_raw = message.get("generation_token_ids")  # type: ignore[union-attr]

        logprobs_obj = choice.get("logprobs")
        content = logprobs_obj.get("content") if isinstance(logprobs_obj, dict) else None
        if content is None:
            if ids_raw is None:
                raise Quarantined("no_token_ids", "choice has neither token_ids nor logprobs.content")
            raise Quarantined("no_logprobs", "choice has token_ids but no logprobs (request logprobs=true)")
        if not isinstance(content, pa.Array):  # an SSE stream joined in bulk gives the entries converted
            content = as_list(content, "logprobs.content")
            reject_booleans(content, "logprobs.content", "logprob")
            reject_head_booleans(content, "logprobs.content")
        entries = typed_array(content, CHAT_CONTENT_ENTRY, "bad_logprob", "logprobs.content")
        tokens = pc.struct_field(entries, "token")
        logprobs = pc.struct_field(entries, "logprob")
        if ids_raw is not None:
            completion = token_id_array(ids_raw, "token_ids")
            if len(tokens) == len(completion) and len(tokens) and pc.all(pc.starts_with(tokens, "token_id:")).as_py():
                _check_same(completion, parse_token_id_strings(tokens, "logprobs token"), "logprobs tokens")
        else:
            completion = parse_token_id_strings(tokens, "logprobs.content[].token")
        topk_ids, topk_logprobs = _heads_from_entries(pc.struct_field(entries, "top_logprobs"))

        sample = Sample(
            request_id=request_id,
            choice_index=index,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=logprobs.cast(pa.float64()),
            finish_reason=finish_reason(choice.get("finish_reason")),
            topk_ids=topk_ids,
            topk_logprobs=topk_logprobs,
            completion_text=message.get("content") if isinstance(message.get("content"), str) else None,  # type: ignore[union-attr]
        )
        return _record_fields(sample, obj, choice, options)

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        """Samples of one response, vLLM's sampled-first heads made the exact top k - 1 (one k per response)."""
        items = super().parse(obj, options)
        exact_chat_heads(items)
        return items

    @staticmethod
    def _text(choice: dict[str, Any]) -> Any:
        message = choice.get("message")
        return message.get("content") if type(message) is dict else None


def _drop_extras(samples: list[Sample | Quarantined]) -> None:
    """vLLM completions' top-k dicts hold the k best plus the sampled token where it ranks below k (k + 1
    entries). k is the response's shortest dict, unless every dict of the response has one size s and holds its
    sampled token last (no higher than any other entry): then every dict is the top s - 1 plus the sampled token
    (where the sampled token did rank s-th, the rest is still the exact top s - 1). The sampled entry is removed
    from every dict of k + 1 entries, in place; heads arrive ordered by logprob."""
    with_heads = [s for s in samples if isinstance(s, Sample) and s.topk_ids is not None]
    if not with_heads:
        return
    k = min(int(pc.min(pc.list_value_length(s.topk_ids)).as_py() or 0) for s in with_heads)
    sizes = {int(pc.max(pc.list_value_length(s.topk_ids)).as_py() or 0) for s in with_heads}
    if sizes == {k} and all(
        extra_sampled_everywhere(s.topk_ids, s.topk_logprobs, s.completion_token_ids) for s in with_heads
    ):
        k -= 1
    for sample in with_heads:
        sample.topk_ids, sample.topk_logprobs = drop_extra_sampled(
            sample.topk_ids, sample.topk_logprobs, sample.completion_token_ids, k
        )


class VllmCompletions(_OpenAIReader):
    name = "openai_completions"
    description = "OpenAI-style text_completion with token IDs (vLLM /v1/completions)"
    object_type = "text_completion"

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        """Samples of one response, the top-k dicts' extra sampled entries dropped with one k for the response
        (see :func:`_drop_extras`)."""
        items = super().parse(obj, options)
        _drop_extras(items)
        return items

    def _choice(
        self, obj: dict[str, Any], request_id: str, index: int, choice: dict[str, Any], options: ParseOptions
    ) -> Sample:
        prompt_raw = choice.get("prompt_token_ids", obj.get("prompt_token_ids"))
        if prompt_raw is None:
            raise Quarantined("no_token_ids", "no prompt_token_ids (start vLLM with return_token_ids)")
        prompt = token_id_array(prompt_raw, "prompt_token_ids")
        lp = choice.get("logprobs")
        if not isinstance(lp, dict):
            if choice.get("token_ids") is None:
                raise Quarantined("no_token_ids", "choice has neither token_ids nor logprobs.tokens")
            raise Quarantined("no_logprobs", "choice has token_ids but no logprobs (request logprobs=N)")
        logprobs = logprob_array(lp.get("token_logprobs"), "logprobs.token_logprobs")
        tokens_raw = lp.get("tokens")
        if choice.get("token_ids") is not None:
            completion = token_id_array(choice.get("token_ids"), "token_ids")
            if (
                isinstance(tokens_raw, list)
                and tokens_raw
                and all(isinstance(t, str) for t in tokens_raw[:1])
                and tokens_raw[0].startswith("token_id:")
                and len(tokens_raw) == len(completion)
            ):
                _check_same(completion, token_id_array(tokens_raw, "logprobs.tokens"), "logprobs.tokens")
        else:
            completion = token_id_array(tokens_raw, "logprobs.tokens")

        topk_ids = topk_logprobs = None
        heads_raw = lp.get("top_logprobs")
        if isinstance(heads_raw, list) and heads_raw and any(h for h in heads_raw[:1]):
            reject_nested_booleans(heads_raw, "logprobs.top_logprobs")
            flat_maps = typed_array(heads_raw, HEAD_MAP, "bad_logprob", "logprobs.top_logprobs")
            map_keys = flat_maps.keys
            if (
                flat_maps.null_count == 0
                and len(flat_maps) == len(completion)
                and map_keys.null_count == 0
                and pc.all(pc.starts_with(map_keys, "token_id:")).as_py()
            ):
                offsets = flat_maps.offsets
                ids = pa.ListArray.from_arrays(offsets, parse_token_id_strings(map_keys, "top_logprobs key"))
                lps = pa.ListArray.from_arrays(offsets, flat_maps.items)
                topk_ids, topk_logprobs = sort_heads_descending(ids, lps)  # extras dropped in parse

        sample = Sample(
            request_id=request_id,
            choice_index=index,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=logprobs,
            finish_reason=finish_reason(choice.get("finish_reason")),
            topk_ids=topk_ids,
            topk_logprobs=topk_logprobs,
            completion_text=choice.get("text") if isinstance(choice.get("text"), str) else None,
        )
        return _record_fields(sample, obj, choice, options)
