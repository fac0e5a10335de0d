"""Hugging Face Text Generation Inference ``/generate`` responses with ``details: true``
(TGI ``router/src/lib.rs``: ``GenerateResponse``, ``Details``, ``BestOfSequence``, ``Token``)::

    {"generated_text": "...",
     "details": {"finish_reason": "eos_token" | "length" | "stop_sequence", "generated_tokens": 3,
                 "seed": 42, "prefill": [{"id", "text", "logprob"}],
                 "tokens": [{"id", "text", "logprob", "special"}],
                 "top_tokens": [[{"id", "text", "logprob", "special"}]],
                 "best_of_sequences": [{"generated_text", "finish_reason", "generated_tokens", "seed",
                                        "prefill", "tokens", "top_tokens"}]}}

The main sequence is choice 0 and ``best_of_sequences[i]`` is choice ``i + 1``. ``prefill`` (the prompt IDs)
is only sent with ``decoder_input_details: true``; without it the prompt is empty unless an envelope's
request side supplies one. TGI responses carry no request ID: it is derived from the token IDs and logprobs
(:func:`prl.formats.fields.derived_request_id`; ingest tells byte-identical records apart by their occurrence).
``completion_text`` is joined from the tokens' text (special tokens left out), so ``return_full_text`` never puts
the prompt in it. A prefill of only a decoder start token (T5 ``<pad>``, BART ``</s>``) is an encoder-decoder
model's: its prompt went to the encoder and is not in the record, so it is ``encoder_decoder``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from prl.formats.base import Format, ParseOptions, Quarantined, Sample, reject_booleans, reject_nested_booleans
from prl.formats.fields import as_dict, as_list, derived_request_id, finish_reason, group_key_of, opt_str
from prl.formats.logprobs import build_heads, field, float_field, int_field, list_offsets, struct_rows


def _ids(rows: pa.StructArray, what: str) -> pa.Array:
    if len(rows) == 0:
        return pa.array([], pa.int64())
    ids = int_field(rows, "id", what)
    if ids is None:
        raise Quarantined("no_token_ids", f"{what} entries have no id")
    return ids


DECODER_START_TEXTS = frozenset({"<pad>", "</s>"})
"""The decoder start token of T5 (``<pad>``) and BART (``</s>``): a prefill of just that token is a seq2seq model's."""


def _decoder_start_only(prefill: pa.StructArray) -> bool:
    texts = field(prefill, "text")
    if len(prefill) != 1 or texts is None or not pa.types.is_string(texts.type):
        return False  # a text that is not a string (a list, an object) is no token's text
    return texts[0].as_py() in DECODER_START_TEXTS


def _completion_text(rows: pa.StructArray) -> str | None:
    """The completion's text from its tokens (special tokens left out), never ``generated_text``: with
    ``return_full_text`` TGI puts the prompt in front of it."""
    texts = field(rows, "text")
    if texts is None or not pa.types.is_string(texts.type):
        return None
    special = field(rows, "special")
    if special is not None and pa.types.is_boolean(special.type):
        texts = pc.filter(texts, pc.invert(pc.fill_null(special, False)))
    return "".join(t for t in texts.to_pylist() if t is not None)


class _Sequence:
    """One parsed TGI sequence: prompt IDs, completion columns, finish reason, text."""

    def __init__(self, seq: dict[str, Any], what: str) -> None:
        prefill = seq.get("prefill")
        prefill_rows = struct_rows([] if prefill is None else prefill, f"{what}.prefill")
        self.prompt_ids = _ids(prefill_rows, f"{what}.prefill")
        if _decoder_start_only(prefill_rows):
            raise Quarantined(
                "encoder_decoder",
                f"{what}.prefill holds only a decoder start token: an encoder-decoder model, whose prompt goes to "
                "the encoder and is not in the record",
            )
        reject_booleans(seq.get("tokens"), f"{what}.tokens", "logprob")
        rows = struct_rows(seq.get("tokens"), f"{what}.tokens")
        self.ids = _ids(rows, f"{what}.tokens")
        self.logprobs = float_field(rows, "logprob", f"{what}.tokens") if len(rows) else pa.array([], pa.float64())
        self.topk_ids, self.topk_logprobs = self._heads(seq.get("top_tokens"), f"{what}.top_tokens")
        self.finish_reason = finish_reason(seq.get("finish_reason"))  # eos_token/stop_sequence → stop
        self.text = _completion_text(rows) if len(rows) else opt_str(seq.get("generated_text"))

    def _heads(self, top: Any, what: str) -> tuple[pa.ListArray | None, pa.ListArray | None]:
        if not top:
            return None, None
        as_list(top, what, "bad_logprob")
        reject_nested_booleans(top, what, "logprob")
        try:
            lists = pa.array(top)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise Quarantined("bad_logprob", f"{what} has an unexpected shape: {exc}") from None
        if not pa.types.is_list(lists.type) or not pa.types.is_struct(lists.type.value_type):
            if pa.types.is_list(lists.type) and pa.types.is_null(lists.type.value_type):
                return None, None
            raise Quarantined("bad_logprob", f"{what} holds {lists.type}, expected lists of tokens")
        entries = lists.flatten()
        if entries.null_count:
            raise Quarantined("bad_logprob", f"{what} has null entries")
        return build_heads(
            list_offsets(lists), _ids(entries, what), float_field(entries, "logprob", what), self.ids, what
        )


class Tgi(Format):
    """TGI ``/generate`` responses; records without ``details`` hold text only and are quarantined."""

    name: ClassVar[str] = "tgi"
    description: ClassVar[str] = "Hugging Face TGI /generate: generated_text + details.tokens[].id"

    def detect(self, obj: Any) -> bool:
        return isinstance(obj, dict) and "generated_text" in obj and "choices" not in obj

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        if obj.get("details") is None:
            raise Quarantined("no_token_ids", "TGI response without details (request with details: true); text only")
        details = as_dict(obj["details"], "details")
        main = dict(details, generated_text=obj.get("generated_text"))
        raw = [main, *as_list(details.get("best_of_sequences") or [], "details.best_of_sequences")]
        parsed: list[_Sequence | Quarantined] = []
        for index, seq in enumerate(raw):
            what = "details" if index == 0 else f"details.best_of_sequences[{index - 1}]"
            try:
                parsed.append(_Sequence(as_dict(seq, what), what))
            except Quarantined as exc:
                exc.choice_index = index
                parsed.append(exc)
        good = [s for s in parsed if isinstance(s, _Sequence)]
        prompt = next((s.prompt_ids for s in good if len(s.prompt_ids)), pa.array([], pa.int64()))
        request_id = derived_request_id(prompt, *(s.ids for s in good), floats=[s.logprobs for s in good])
        out: list[Sample | Quarantined] = []
        for index, seq in enumerate(parsed):
            if isinstance(seq, Quarantined):
                out.append(seq)
                continue
            out.append(
                Sample(
                    request_id=request_id,
                    choice_index=index,
                    prompt_token_ids=seq.prompt_ids if len(seq.prompt_ids) else prompt,
                    completion_token_ids=seq.ids,
                    completion_logprobs=seq.logprobs,
                    finish_reason=seq.finish_reason,
                    topk_ids=seq.topk_ids,
                    topk_logprobs=seq.topk_logprobs,
                    completion_text=seq.text,
                    group_key=group_key_of(obj, options),
                    policy_version=options.policy_version,
                )
            )
        return out
