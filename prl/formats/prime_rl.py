"""prime-rl rollout files: verifiers v1 episodes, one per line.

Written by prime-rl's file monitor (``FileMonitor.log_episodes`` in ``src/prime_rl/monitors/file.py``) to
``{run}/rollouts/step_N/{train,eval}/{all,effective}/traces.jsonl``, each line ``orjson.dumps(episode.to_record())``
(verifiers ``verifiers/v1/episode.py``, ``Episode.to_record``: ``model_dump(mode="json", exclude_none=True)``)::

    {"id": "...", "env": {"id": ...}, "task": {...}, "group": {"id": ...},
     "run": {"type": "train", "id": ..., "work": {"type": "train", "step": 12, "policy": {"start": 11, "end": 12}}},
     "ok": true, "errors": [...],
     "traces": [{"id": "...", "agent": {"name": "agent", "trainable": true, ...},
                 "nodes": [{"parent": null | int, "message": {"role": ...}, "sampled": bool,
                            "token_ids": [...], "mask": [...], "logprobs": [...], ...}],
                 "calls": [{"node": int, "model": ..., "finish_reason": "stop" | "length" | "tool_calls", ...}],
                 "rewards": {"name": {"score": x, "weight": w} | null}, "ok": bool, ...}]}

Each node holds only the tokens it adds to the sequence (verifiers ``verifiers/v1/graph.py``): an assistant
node holds the generation-prompt scaffold then its sampled completion (``mask`` true on the completion,
``logprobs`` one per masked token). Every model call is one sample: its prompt is the concatenated
``token_ids`` of the nodes from the root to the call's node plus that node's unmasked scaffold, its completion
the node's masked tokens — exactly ``prompt_ids + completion_ids`` as the model saw them. Calls of one trace
are turns of one session (``session_id`` = trace id, turn = call order), request id ``<trace id>/<turn>``.
``rewards`` become reward events (value = score × weight, per name; scoring that did not run is skipped);
the policy version is the run's ``work.policy.start``, the oldest weights that sampled the episode. An episode
with no trace (a failed episode) is ``upstream_error`` with its last error; a trace of a non-trainable agent
(``agent.trainable`` false) is quarantined as ``not_trainable``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa

from prl.formats.base import Format, ParseOptions, Quarantined, Sample, logprob_array, token_id_array
from prl.formats.fields import (
    as_dict,
    as_list,
    finish_reason,
    group_key_of,
    json_text,
    opt_dict,
    opt_str,
    policy_version_of,
    timestamp_us,
)
from prl.formats.rollouts import mask_array


def _is_episode(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("traces"), list) and "task" in obj and "ok" in obj


class PrimeRL(Format):
    """prime-rl / verifiers v1 episode records (``traces[].nodes[]``)."""

    name: ClassVar[str] = "prime_rl"
    description: ClassVar[str] = "prime-rl rollouts (verifiers v1 episodes): traces[].nodes[].token_ids"

    def detect(self, obj: Any) -> bool:
        return _is_episode(obj)

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        traces = as_list(obj.get("traces"), "traces")
        if not traces:
            errors = [e for e in as_list(obj.get("errors") or [], "errors") if isinstance(e, dict)]
            last = (
                f"{errors[-1].get('type')}: {str(errors[-1].get('message'))[:300]}" if errors else "no error recorded"
            )
            raise Quarantined("upstream_error", f"the episode produced no trace ({last})")
        policy = opt_dict(opt_dict(opt_dict(obj.get("run")).get("work")).get("policy"))
        version = policy_version_of(policy.get("start"), options=options)
        out: list[Sample | Quarantined] = []
        for index, trace in enumerate(traces):
            try:
                samples = _trace_samples(as_dict(trace, f"traces[{index}]"), f"traces[{index}]")
            except Quarantined as q:
                q.choice_index = 0
                out.append(q)
                continue
            for sample in samples:
                if isinstance(sample, Sample):
                    sample.policy_version = version
                    sample.group_key = group_key_of(obj, options)
            out.extend(samples)
        return out


def _trace_samples(trace: dict[str, Any], what: str) -> list[Sample | Quarantined]:
    trace_id = opt_str(trace.get("id"))
    if not trace_id:
        raise Quarantined("missing_request_id", f"{what} has no 'id'")
    if opt_dict(trace.get("agent")).get("trainable") is False:
        raise Quarantined("not_trainable", f"{what} is a non-trainable agent's trace")
    nodes = [as_dict(node, f"{what}.nodes[{i}]") for i, node in enumerate(as_list(trace.get("nodes"), f"{what}.nodes"))]
    calls = [call for call in as_list(trace.get("calls") or [], f"{what}.calls") if isinstance(call, dict)]
    sampled = [c for c in calls if type(c.get("node")) is int]
    if not sampled:
        raise Quarantined("no_token_ids", f"{what} records no model call with a node (a relay/eval trace)")
    rewards = {
        str(name): _reward_value(reward)
        for name, reward in opt_dict(trace.get("rewards")).items()
        if isinstance(reward, dict)
    }
    out: list[Sample | Quarantined] = []
    for turn, call in enumerate(sampled):
        try:
            sample = _call_sample(nodes, call, f"{what}.calls[{turn}]")
        except Quarantined as q:
            q.choice_index = 0
            out.append(q)
            continue
        sample.request_id = f"{trace_id}/{turn}"
        sample.session_id, sample.turn = trace_id, turn
        sample.rewards = rewards or None
        out.append(sample)
    return out


def _reward_value(reward: dict[str, Any]) -> Any:
    score, weight = reward.get("score"), reward.get("weight", 1.0)
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            return weight  # a weight that is not a number (true is no 1.0): quarantined as the reward's value
        return score * weight
    return score  # not a number: the rewards table quarantines it with its reason


def _call_sample(nodes: list[dict[str, Any]], call: dict[str, Any], what: str) -> Sample:
    """One call: the prompt is the path to its node plus the node's scaffold, the completion its masked tokens."""
    index = call["node"]
    if not 0 <= index < len(nodes):
        raise Quarantined("bad_shape", f"{what} names node {index}, but the trace has {len(nodes)} nodes")
    path = _path(nodes, index, what)
    node = nodes[index]
    ids = token_id_array(node.get("token_ids"), f"nodes[{index}].token_ids")
    mask = mask_array(node.get("mask"), f"nodes[{index}].mask")
    if len(mask) != len(ids):
        raise Quarantined("mask_length_mismatch", f"nodes[{index}] has {len(mask)} mask entries for {len(ids)} tokens")
    sampled = int(pa.compute.sum(mask).as_py() or 0)
    split = len(ids) - sampled
    if sampled and not pa.compute.all(mask.slice(split)).as_py():
        raise Quarantined("bad_mask", f"nodes[{index}] sampled tokens are not one run at the end of the node")
    context = [token_id_array(nodes[i].get("token_ids"), f"nodes[{i}].token_ids") for i in path[:-1]]
    prompt = pa.concat_arrays([*context, ids.slice(0, split)]) if context else ids.slice(0, split)
    message = opt_dict(node.get("message"))
    return Sample(
        request_id="",
        choice_index=0,
        prompt_token_ids=prompt,
        completion_token_ids=ids.slice(split),
        completion_logprobs=logprob_array(node.get("logprobs"), f"nodes[{index}].logprobs"),
        finish_reason=finish_reason(call.get("finish_reason")),
        model=opt_str(call.get("model")),
        created_at_us=timestamp_us(opt_dict(call.get("time")).get("start") or node.get("timestamp")),
        messages=json_text([opt_dict(nodes[i].get("message")) for i in path[:-1]]),
        completion_text=opt_str(message.get("content")),
    )


def _path(nodes: list[dict[str, Any]], index: int, what: str) -> list[int]:
    """Node indices from the root to ``index`` (parents must come earlier: the graph is stored in turn order)."""
    path = [index]
    while (parent := nodes[path[-1]].get("parent")) is not None:
        if type(parent) is not int or not 0 <= parent < path[-1]:
            raise Quarantined("bad_shape", f"{what}: node {path[-1]} has parent {parent!r}, not an earlier node")
        path.append(parent)
    return path[::-1]
