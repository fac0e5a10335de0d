"""vLLM's token-in/token-out endpoint and offline ``RequestOutput`` dumps.

``/inference/v1/generate`` (vLLM ``entrypoints/serve/disagg/protocol.py``, ``GenerateResponse``)::

    {"request_id": "...", "choices": [{"index": 0, "token_ids": [...], "finish_reason": "stop",
      "logprobs": {"content": [{"token": "token_id:N" | "token_id": N, "logprob": x,
                                "top_logprobs": [...]}]}}],
     "prompt_logprobs": ..., "kv_transfer_params": ...}

Some deployments also echo ``prompt_token_ids`` at the top level; the request body (``token_ids``) carries
the prompt otherwise, which the proxy-capture envelope fills in. Older dumps spell ``logprobs`` as one
``{"<id>": {"logprob", "rank", "decoded_token"}}`` dict per position, as ``RequestOutput`` does.

``RequestOutput`` (``vllm/outputs.py``) serialized one per line::

    {"request_id": "...", "prompt": "...", "prompt_token_ids": [...], "outputs": [{"index": 0,
      "text": "...", "token_ids": [...], "cumulative_logprob": x, "logprobs": [{"<id>": {...}}, ...],
      "finish_reason": "stop", "stop_reason": null}], "finished": true, "metrics": {...}}
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa

from prl.formats.base import Format, ParseOptions, Quarantined, Sample, token_id_array
from prl.formats.fields import (
    as_dict,
    as_list,
    choice_index,
    derived_request_id,
    finish_reason,
    group_key_of,
    opt_dict,
    opt_str,
    policy_version_of,
    session_of,
    timestamp_us,
)
from prl.formats.logprobs import TokenColumns, completions_logprobs, content_logprobs, dict_logprobs

EMPTY_IDS = pa.array([], pa.int64())


def choice_logprobs(logprobs: Any, ids: pa.Array, what: str) -> TokenColumns:
    """Columns from a choice's ``logprobs`` in any of the shapes vLLM has used for it (``no_logprobs`` when
    the server sent none: the request did not ask for them)."""
    if logprobs is None:
        raise Quarantined("no_logprobs", f"{what} is missing (request logprobs in sampling_params)")
    if isinstance(logprobs, list):
        return dict_logprobs(logprobs, ids, what)
    if isinstance(logprobs, dict) and "content" in logprobs:
        content = logprobs["content"]
        return content_logprobs([] if content is None else content, f"{what}.content", ids)
    if isinstance(logprobs, dict) and "token_logprobs" in logprobs:
        return completions_logprobs(logprobs, what, ids)
    raise Quarantined("bad_logprob", f"{what} is {type(logprobs).__name__} of an unknown shape")


def _is_generate(obj: Any) -> bool:
    if not isinstance(obj, dict) or "request_id" not in obj or "object" in obj:
        return False
    choices = obj.get("choices")
    return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict) and ("token_ids" in choices[0])


class VllmGenerate(Format):
    """vLLM ``/inference/v1/generate`` responses (tokens in, tokens out)."""

    name: ClassVar[str] = "vllm_generate"
    description: ClassVar[str] = "vLLM /inference/v1/generate: request_id + choices[].token_ids"

    def detect(self, obj: Any) -> bool:
        return _is_generate(obj)

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        choices = as_list(obj.get("choices"), "choices")
        request_id = opt_str(obj.get("request_id"))
        if request_id is None:
            raise Quarantined("missing_request_id", "request_id is missing or not a string")
        prompt = obj.get("prompt_token_ids")
        prompt_ids = EMPTY_IDS if prompt is None else token_id_array(prompt, "prompt_token_ids")
        out: list[Sample | Quarantined] = []
        for position, choice in enumerate(choices):
            try:
                out.append(self._choice(obj, choice, position, request_id, prompt_ids, options))
            except Quarantined as exc:
                exc.choice_index = position if exc.choice_index is None else exc.choice_index
                out.append(exc)
        return out

    def _choice(
        self,
        obj: dict[str, Any],
        choice: Any,
        position: int,
        request_id: str,
        prompt_ids: pa.Array,
        options: ParseOptions,
    ) -> Sample:
        what = f"choices[{position}]"
        choice = as_dict(choice, what)
        index = choice_index(choice.get("index"), position, what)
        if choice.get("token_ids") is None:
            raise Quarantined("no_token_ids", f"{what} has no token_ids", index)
        ids = token_id_array(choice["token_ids"], f"{what}.token_ids")
        session, turn = session_of(obj)
        columns = choice_logprobs(choice.get("logprobs"), ids, f"{what}.logprobs")
        return Sample(
            request_id=request_id,
            choice_index=index,
            prompt_token_ids=prompt_ids,
            completion_token_ids=ids,
            completion_logprobs=columns.logprobs,
            finish_reason=finish_reason(choice.get("finish_reason")),
            topk_ids=columns.topk_ids,
            topk_logprobs=columns.topk_logprobs,
            model=opt_str(obj.get("model")),
            created_at_us=timestamp_us(obj.get("created")),
            session_id=session,
            turn=turn,
            group_key=group_key_of(obj, options),
            policy_version=policy_version_of(opt_dict(obj.get("metadata")).get("weight_version"), options=options),
        )


def _is_request_output(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("outputs"), list) and "prompt_token_ids" in obj


class VllmRequestOutput(Format):
    """vLLM offline ``RequestOutput`` objects serialized one per line (``LLM.generate`` dumps)."""

    name: ClassVar[str] = "vllm_request_output"
    description: ClassVar[str] = "vLLM RequestOutput dumps: prompt_token_ids + outputs[]"

    def detect(self, obj: Any) -> bool:
        return _is_request_output(obj)

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        outputs = as_list(obj.get("outputs"), "outputs")
        prompt_ids = token_id_array(obj.get("prompt_token_ids"), "prompt_token_ids")
        request_id = opt_str(obj.get("request_id"))
        metrics = opt_dict(obj.get("metrics"))
        created = timestamp_us(metrics.get("arrival_time"))
        parsed: list[tuple[int, Any, pa.Array] | Quarantined] = []
        for position, output in enumerate(outputs):
            what = f"outputs[{position}]"
            try:
                output = as_dict(output, what)
                ids = token_id_array(output.get("token_ids"), f"{what}.token_ids")
                parsed.append((position, output, ids))
            except Quarantined as exc:
                exc.choice_index = position
                parsed.append(exc)
        if request_id is None:
            request_id = derived_request_id(prompt_ids, *(p[2] for p in parsed if not isinstance(p, Quarantined)))
        out: list[Sample | Quarantined] = []
        for item in parsed:
            if isinstance(item, Quarantined):
                out.append(item)
                continue
            position, output, ids = item
            what = f"outputs[{position}]"
            try:
                index = choice_index(output.get("index"), position, what)
                columns = choice_logprobs(output.get("logprobs"), ids, f"{what}.logprobs")
                out.append(
                    Sample(
                        request_id=request_id,
                        choice_index=index,
                        prompt_token_ids=prompt_ids,
                        completion_token_ids=ids,
                        completion_logprobs=columns.logprobs,
                        finish_reason=finish_reason(output.get("finish_reason")),
                        topk_ids=columns.topk_ids,
                        topk_logprobs=columns.topk_logprobs,
                        completion_text=opt_str(output.get("text")),
                        created_at_us=created,
                        group_key=group_key_of(obj, options),
                        policy_version=options.policy_version,
                    )
                )
            except Quarantined as exc:
                exc.choice_index = position if exc.choice_index is None else exc.choice_index
                out.append(exc)
        return out
