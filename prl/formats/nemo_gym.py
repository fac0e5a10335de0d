"""NeMo Gym rollouts and the OpenAI Responses objects inside them.

Written by NeMo Gym's rollout collection (``ng_collect_rollouts``: ``RolloutCollectionHelper.run_from_config`` in
``nemo_gym/rollout_collection.py``, one ``orjson`` line per rollout), from NeMo Gym's vLLM model server
(``responses_api_models/vllm_model``) with token capture on; the token fields are ``TokenIDLogProbMixin``
(``nemo_gym/openai_utils.py``)::

    {"responses_create_params": {"input": [...], "temperature": ..., ...},
     "response": {"id": "resp_...", "object": "response", "model": ..., "created_at": 1775583409.0,
                  "incomplete_details": null | {"reason": "max_output_tokens"},
                  "output": [{"type": "reasoning", ...},
                             {"type": "message" | "function_call" | "reasoning", ...,
                              "prompt_token_ids": [...], "generation_token_ids": [...],
                              "generation_log_probs": [...]}, ...]},
     "reward": 1.0, ...task fields...}

A bare Responses object (``"object": "response"`` with such output items) is read the same way.

Every output item carrying ``generation_token_ids`` closes one model call: one sample, its prompt exactly as
sent (``prompt_token_ids``: the whole context, earlier calls and tool output included). Calls of one rollout are
turns of one session (``session_id`` = the response id, ``turn`` = the call's position in output order), and
their request id is ``<response id>/<turn>``. A call's finish reason is ``tool_calls`` when its item is a
``function_call``, ``length`` for the last call of a response cut by ``incomplete_details.reason ==
"max_output_tokens"``, else ``stop``. The rollout's ``reward`` goes to the ``rewards`` table (name ``reward``)
for every call of the rollout, in the same ingest. Items with empty token lists (servers run without token
capture) and rollouts with none at all are ``no_token_ids``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from prl.formats.base import Format, ParseOptions, Quarantined, Sample, logprob_array, token_id_array
from prl.formats.fields import (
    as_dict,
    as_list,
    group_key_of,
    json_text,
    opt_dict,
    opt_str,
    policy_version_of,
    sampling_settings,
    timestamp_us,
)

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _is_response(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("object") == "response" and isinstance(obj.get("output"), list)


def _carries_tokens(response: dict[str, Any]) -> bool:
    return any(isinstance(item, dict) and "generation_token_ids" in item for item in response["output"])


class NemoGym(Format):
    """NeMo Gym rollouts (``responses_create_params`` + ``response`` + ``reward``) and bare Responses objects
    whose output items carry ``generation_token_ids``."""

    name: ClassVar[str] = "nemo_gym"
    description: ClassVar[str] = "NeMo Gym rollouts / Responses objects: output[].generation_token_ids"

    def detect(self, obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        if "responses_create_params" in obj and isinstance(obj.get("response"), dict):
            return True
        return _is_response(obj) and _carries_tokens(obj)

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        rollout = "responses_create_params" in obj
        response = as_dict(obj.get("response"), "response") if rollout else obj
        params = opt_dict(obj.get("responses_create_params"))
        response_id = opt_str(response.get("id"))
        if not response_id:
            raise Quarantined("missing_request_id", "the response has no 'id'")
        output = as_list(response.get("output"), "response.output")
        calls = [
            (position, item)
            for position, item in enumerate(output)
            if isinstance(item, dict) and item.get("generation_token_ids")
        ]
        if not calls:
            raise Quarantined(
                "no_token_ids",
                "no output item carries generation_token_ids (run NeMo Gym's vLLM model server with token capture)",
            )
        reward = obj.get("reward") if rollout else None
        rewards = {"reward": reward} if reward is not None else None
        cut = opt_dict(response.get("incomplete_details")).get("reason") in ("max_output_tokens", "max_tokens")
        settings = sampling_settings({**params, **{k: v for k, v in response.items() if v is not None}})
        common = {
            "session_id": response_id,
            "model": opt_str(response.get("model")),
            "created_at_us": timestamp_us(response.get("created_at")),
            "group_key": group_key_of(obj, options),
            "policy_version": policy_version_of(
                opt_dict(response.get("metadata")).get("weight_version"), options=options
            ),
            "temperature": settings["temperature"],
            "top_p": settings["top_p"],
        }
        out: list[Sample | Quarantined] = []
        for turn, (position, item) in enumerate(calls):
            try:
                sample = _call(item, f"output[{position}]", response_id, turn, last=turn == len(calls) - 1, cut=cut)
            except Quarantined as q:
                q.choice_index = 0
                out.append(q)
                continue
            for name, value in common.items():
                setattr(sample, name, value)
            if turn == 0:
                sample.messages = _messages(params.get("input"))
            sample.rewards = rewards
            out.append(sample)
        return out


def _call(item: dict[str, Any], what: str, response_id: str, turn: int, *, last: bool, cut: bool) -> Sample:
    """One model call: the output item that carries its token fields."""
    missing = [name for name in TOKEN_FIELDS if item.get(name) is None]
    if missing:
        raise Quarantined(
            "no_logprobs" if missing == ["generation_log_probs"] else "bad_shape", f"{what} has no {missing}"
        )
    kind = item.get("type")
    if kind == "function_call":
        finish = "tool_calls"
    elif last and cut:
        finish = "length"
    else:
        finish = "stop"
    return Sample(
        request_id=f"{response_id}/{turn}",
        choice_index=0,
        prompt_token_ids=token_id_array(item["prompt_token_ids"], f"{what}.prompt_token_ids"),
        completion_token_ids=token_id_array(item["generation_token_ids"], f"{what}.generation_token_ids"),
        completion_logprobs=logprob_array(item["generation_log_probs"], f"{what}.generation_log_probs"),
        finish_reason=finish,
        turn=turn,
        completion_text=_text(item),
    )


def _messages(value: Any) -> str | None:
    """The request's ``input`` as chat messages (compact JSON): a list as it is, a string as one user message."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    return json_text(value) if isinstance(value, list) else None


def _text(item: dict[str, Any]) -> str | None:
    """The visible text of a message item (its ``output_text`` parts); None for other items."""
    if item.get("type") != "message" or not isinstance(item.get("content"), list):
        return None
    parts = [opt_str(part.get("text")) for part in item["content"] if isinstance(part, dict)]
    return "".join(p for p in parts if p) or None


__all__ = ["NemoGym"]
