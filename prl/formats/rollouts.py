"""RL rollout dumps: what training frameworks write about each sampled trajectory, one JSON object per line.

* verl (``experimental/agent_loop/agent_loop.py``, ``AgentLoopOutput``): ``prompt_ids`` (or ``input_ids``),
  ``response_ids``, ``response_mask`` (1 on model tokens, 0 on tool/observation tokens),
  ``response_logprobs`` (or ``rollout_log_probs``, the ``DataProto`` key), ``reward_score``, ``num_turns``.
* slime (``slime/utils/types.py``, ``Sample``): ``tokens`` = prompt + response, ``response_length``,
  ``loss_mask`` and ``rollout_log_probs`` over the response, ``status``, ``reward``, ``index``,
  ``weight_versions``, ``metadata``.
* SkyRL (``skyrl_train/generators/base.py``, ``GeneratorOutput``): ``prompt_token_ids``, ``response_ids``,
  ``loss_masks``, ``rollout_logprobs``, ``stop_reasons``, ``rewards`` — either one batch per line (lists of
  lists, one sample per row) or one row per line (``loss_mask``/``stop_reason`` also accepted).

No framework writes these objects to disk itself with their token IDs (verl's ``_dump_generations`` and SkyRL's
``dump_per_dataset_eval_results`` write decoded text, :mod:`prl.formats.text_dumps`; slime's
``--save-debug-rollout-data`` writes ``torch.save`` files): they are the frameworks' own in-memory rollout types,
read as a one-line hook dumps them (``json.dumps(sample.to_dict())`` in slime, ``asdict`` of the output in verl
and SkyRL). The readers stay because that hook is how users of these frameworks keep their rollouts; prime-rl,
which does write rollouts, has its own reader (:mod:`prl.formats.prime_rl`).

These dumps rarely carry a request ID that stays unique across runs (slime's ``index`` and SkyRL's
``instance_id`` restart with every run), so the request ID is always derived: ``"sha256:" + sha256(prompt
ids, completion ids, salt)[:32]`` (:func:`prl.formats.fields.derived_request_id`), choice index 0. The salt
is the record's own per-sample identifiers (``request_id``, ``uid``, ``index``, ``group_index``,
``trajectory_id``, ``example_id``, ``rollout_id``, ``step``, and for a SkyRL batch the row and its trajectory
ID), so two group members that sampled the very same tokens stay two samples, while re-reading the same dump
gives the same IDs and never duplicates a sample.

Masked positions (``completion_mask`` false: tool output, observations) were not sampled, and frameworks pad
their logprobs with 0.0; those logprobs become null so a 0.0 placeholder never reads as log q = 0.
Rewards stored inline (``reward``, ``reward_score``, ``rewards``) are not part of a trace row; they belong to
``prl ingest --kind rewards``.
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
    first_present,
    json_list,
    logprob_array,
    token_id_array,
)
from prl.formats.fields import (
    as_dict,
    as_list,
    derived_request_id,
    finish_reason,
    group_key_of,
    json_text,
    opt_dict,
    opt_str,
    policy_version_of,
    request_session,
    session_of,
)


def mask_array(values: Any, what: str) -> pa.Array:
    """A 0/1 (or boolean) JSON list as a boolean array; nulls and non-numbers are ``bad_mask``."""
    array = json_list(values, what, "bad_mask", "a list of 0/1")
    if pa.types.is_null(array.type) and len(array) == 0:
        return pa.array([], pa.bool_())
    if array.null_count:
        raise Quarantined("bad_mask", f"{what} has null entries")
    if pa.types.is_boolean(array.type):
        return array
    if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
        return pc.not_equal(array, 0)
    raise Quarantined("bad_mask", f"{what} holds {array.type} values, expected 0/1")


SALT_KEYS = ("request_id", "uid", "index", "group_index", "trajectory_id", "example_id", "rollout_id", "step")


def rollout_sample(
    obj: dict[str, Any],
    options: ParseOptions,
    *,
    salt: Any = None,
    prompt_ids: pa.Array,
    completion_ids: pa.Array,
    logprobs: Any,
    mask: Any,
    finish: Any,
    what: str,
) -> Sample:
    """A Sample from one rollout's parts; ``logprobs``/``mask`` are the raw JSON lists (or None), ``finish``
    the raw finish reason (normalised here; a dump without one is ``bad_finish_reason``)."""
    n = len(completion_ids)
    if logprobs is None:
        raise Quarantined("no_logprobs", f"{what} has no rollout logprobs (enable them in the rollout config)")
    lps = logprob_array(logprobs, f"{what} logprobs")
    completion_mask = None
    if mask is not None:
        completion_mask = mask_array(mask, f"{what} mask")
        if len(completion_mask) != n:
            raise Quarantined(
                "mask_length_mismatch",
                f"{what} mask has {len(completion_mask)} entries for {n} completion tokens",
            )
        if len(lps) == n and not pc.all(completion_mask).as_py():
            lps = pc.if_else(completion_mask, lps, pa.scalar(None, pa.float64()))
    messages = obj.get("messages")
    if messages is None and isinstance(obj.get("prompt"), list):
        messages = obj["prompt"]
    session, turn = session_of(obj)
    extra = opt_dict(obj.get("extra_fields"))
    return Sample(
        request_id=derived_request_id(
            prompt_ids, completion_ids, salt=json_text([[obj.get(k) for k in SALT_KEYS], salt])
        ),
        choice_index=0,
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        completion_logprobs=lps,
        finish_reason=finish_reason(finish),
        completion_mask=completion_mask,
        session_id=session or request_session(extra),
        turn=turn,
        policy_version=policy_version_of(
            obj.get("weight_version"), obj.get("policy_version"), extra.get("weight_version"), options=options
        ),
        messages=json_text(messages) if messages is not None else None,
        completion_text=opt_str(first_present(obj, "response", "completion_text")),
        model=opt_str(obj.get("model")),
        group_key=group_key_of(obj, options),
    )


def _finish(obj: dict[str, Any]) -> str | None:
    """An explicit finish reason if the dump kept one (``finish_reason``, ``stop_reason``,
    ``extra_fields.finish_reason``); else ``is_truncated`` → length / stop; else None."""
    reason = opt_str(first_present(obj, "finish_reason", "stop_reason"))
    if reason is None:
        reason = opt_str(opt_dict(obj.get("extra_fields")).get("finish_reason"))
    if reason is None and isinstance(obj.get("is_truncated"), bool):
        reason = "length" if obj["is_truncated"] else "stop"
    return reason


class Verl(Format):
    """verl agent-loop outputs (``AgentLoopOutput``) dumped one per line."""

    name: ClassVar[str] = "verl"
    description: ClassVar[str] = "verl rollouts: prompt_ids + response_ids + response_mask"

    def detect(self, obj: Any) -> bool:
        return (
            isinstance(obj, dict)
            and "response_ids" in obj
            and ("prompt_ids" in obj or "input_ids" in obj)
            and "prompt_token_ids" not in obj
        )

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        prompt_key = "prompt_ids" if "prompt_ids" in obj else "input_ids"
        prompt = token_id_array(obj.get(prompt_key), prompt_key)
        completion = token_id_array(obj.get("response_ids"), "response_ids")
        logprobs = first_present(obj, "response_logprobs", "rollout_log_probs")
        return [
            rollout_sample(
                obj,
                options,
                prompt_ids=prompt,
                completion_ids=completion,
                logprobs=logprobs,
                mask=obj.get("response_mask"),
                finish=_finish(obj),
                what="response",
            )
        ]


SLIME_STATUS = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "error"}
"""slime ``Sample.Status`` → prl finish reason."""


class Slime(Format):
    """slime ``Sample`` objects dumped one per line (``tokens`` = prompt + response)."""

    name: ClassVar[str] = "slime"
    description: ClassVar[str] = "slime rollouts: tokens + response_length + rollout_log_probs"

    def detect(self, obj: Any) -> bool:
        return isinstance(obj, dict) and "tokens" in obj and "response_length" in obj

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        tokens = token_id_array(obj.get("tokens"), "tokens")
        length = obj.get("response_length")
        if type(length) is not int or not 0 <= length <= len(tokens):
            raise Quarantined("bad_shape", f"response_length {length!r} is not an integer in [0, {len(tokens)}]")
        split = len(tokens) - length
        status = obj.get("status")
        if isinstance(status, dict):  # Enum serialized as {"value": ...} by some dumpers
            status = status.get("value")
        reason = SLIME_STATUS.get(status, status) if isinstance(status, str) else _finish(obj)
        sample = rollout_sample(
            obj,
            options,
            prompt_ids=tokens.slice(0, split),
            completion_ids=tokens.slice(split),
            logprobs=obj.get("rollout_log_probs"),
            mask=obj.get("loss_mask"),
            finish=reason,
            what="response",
        )
        versions = obj.get("weight_versions")
        if isinstance(versions, list) and versions and opt_str(versions[0]) is not None:
            sample.policy_version = opt_str(versions[0])  # the oldest weights that sampled any of it
        sample.session_id = sample.session_id or opt_str(obj.get("session_id"))
        return [sample]


class SkyRL(Format):
    """SkyRL ``GeneratorOutput``: a whole batch per line (lists of lists) or one row per line."""

    name: ClassVar[str] = "skyrl"
    description: ClassVar[str] = "SkyRL rollouts: prompt_token_ids + response_ids + loss_masks"

    def detect(self, obj: Any) -> bool:
        return isinstance(obj, dict) and "response_ids" in obj and "prompt_token_ids" in obj

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        responses = as_list(obj.get("response_ids"), "response_ids", "bad_token_id")
        if responses and isinstance(responses[0], list):
            return self._batch(obj, responses, options)
        return [
            self._row(
                obj,
                options,
                obj.get("prompt_token_ids"),
                responses,
                first_present(obj, "rollout_logprobs", "rollout_log_probs"),
                first_present(obj, "loss_masks", "loss_mask"),
                opt_str(first_present(obj, "stop_reason", "stop_reasons", "finish_reason")),
                "row",
            )
        ]

    def _batch(self, obj: dict[str, Any], responses: list[Any], options: ParseOptions) -> list[Sample | Quarantined]:
        rows = len(responses)

        def column(key: str) -> list[Any]:
            values = obj.get(key)
            if values is None:
                return [None] * rows
            values = as_list(values, key)
            if len(values) != rows:
                raise Quarantined("length_mismatch", f"{key} has {len(values)} rows, response_ids has {rows}")
            return values

        prompts = column("prompt_token_ids")
        logprobs = column("rollout_logprobs")
        masks = column("loss_masks")
        reasons = column("stop_reasons")
        trajectories = column("trajectory_ids")
        out: list[Sample | Quarantined] = []
        for row in range(rows):
            try:
                out.append(
                    self._row(
                        obj,
                        options,
                        prompts[row],
                        responses[row],
                        logprobs[row],
                        masks[row],
                        opt_str(reasons[row]),
                        f"row {row}",
                        salt=[row, trajectories[row]],
                    )
                )
            except Quarantined as exc:
                exc.choice_index = row
                out.append(exc)
        return out

    def _row(
        self,
        obj: dict[str, Any],
        options: ParseOptions,
        prompt: Any,
        response: Any,
        logprobs: Any,
        mask: Any,
        reason: str | None,
        what: str,
        salt: Any = None,
    ) -> Sample:
        return rollout_sample(
            obj,
            options,
            salt=salt,
            prompt_ids=token_id_array(prompt, f"{what} prompt_token_ids"),
            completion_ids=token_id_array(response, f"{what} response_ids"),
            logprobs=logprobs,
            mask=mask,
            finish=reason,
            what=what,
        )
