"""SGLang native ``/generate`` responses.

Shape: ``{"text", "output_ids"?, "meta_info": {"id", "finish_reason": {"type": ...}, "prompt_tokens",
"completion_tokens", "output_token_logprobs": [[logprob, token_id, text|null], ...], "output_top_logprobs":
[[[logprob, token_id, text|null], ...] | null, ...], "input_token_logprobs"?: [[logprob|null, token_id, text], ...],
"weight_version"? (older "model_version"), "weight_versions"?}}``.

Prompt IDs come from the request echo (``input_ids`` at top level or in ``meta_info``) or from the
``input_token_logprobs`` triples (``return_logprob`` with ``logprob_start_len=0``). ``weight_versions`` is either
a list of ``{"version", "start", "end"}`` spans or one version per completion token (run-length encoded here).

Triples mix types, so they are transposed with ``zip(*triples)`` (a C-level transpose) and each column goes to
Arrow in one conversion.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from prl.formats.base import Format, ParseOptions, Quarantined, Sample, logprob_array, token_id_array
from prl.formats.fields import (
    as_dict,
    as_list,
    as_version,
    finish_reason,
    group_key_of,
    opt_float,
    opt_int,
    policy_version_of,
    session_of,
    timestamp_us,
)

_LIST = frozenset({list})
_VERSION_TYPES = frozenset({str, int})


def _columns(triples: list[Any], what: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(logprobs, ids) columns of ``[logprob, id, text]`` triples."""
    if not triples:
        return (), ()
    if not set(map(type, triples)) <= _LIST or not all(len(t) >= 2 for t in (triples[0], triples[-1])):
        raise Quarantined("bad_shape", f"{what} entries are not [logprob, token_id, text] triples")
    columns = list(zip(*triples))
    if len(columns) < 2 or len(columns[0]) != len(triples):
        raise Quarantined("bad_shape", f"{what} entries are not [logprob, token_id, text] triples")
    return columns[0], columns[1]


def _heads(heads_raw: Any, n_positions: int) -> tuple[pa.Array | None, pa.Array | None]:
    if not isinstance(heads_raw, list) or not heads_raw:
        return None, None
    if len(heads_raw) != n_positions or any(h is None for h in heads_raw):
        raise Quarantined("topk_length_mismatch", "output_top_logprobs does not cover every completion token")
    if not set(map(type, heads_raw)) <= _LIST:
        raise Quarantined("bad_shape", "output_top_logprobs entries are not lists of [logprob, token_id, text] triples")
    lengths = np.fromiter(map(len, heads_raw), dtype=np.int32, count=len(heads_raw))
    lps, ids = _columns(list(chain.from_iterable(heads_raw)), "output_top_logprobs")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    offsets_arr = pa.array(offsets)
    return (
        pa.ListArray.from_arrays(offsets_arr, token_id_array(list(ids), "output_top_logprobs ids")),
        pa.ListArray.from_arrays(offsets_arr, logprob_array(list(lps), "output_top_logprobs logprobs")),
    )


def version_spans(value: Any, n_tokens: int) -> list[dict[str, Any]] | None:
    """``weight_versions`` as ``[{version, start, end}]`` spans over completion positions (end exclusive)."""
    if not isinstance(value, list) or not value:
        return None
    if isinstance(value[0], dict):
        spans = []
        for span in value:
            if not isinstance(span, dict) or opt_int(span.get("start")) is None or opt_int(span.get("end")) is None:
                raise Quarantined("bad_shape", "weight_versions spans need integer start and end")
            spans.append({"version": as_version(span.get("version")), "start": span["start"], "end": span["end"]})
        return spans
    if len(value) != n_tokens:
        raise Quarantined("bad_shape", f"weight_versions has {len(value)} entries for {n_tokens} tokens")
    if not set(map(type, value)) <= _VERSION_TYPES:
        raise Quarantined("bad_shape", "weight_versions entries are not versions (strings or integers)")
    versions = np.asarray([str(v) for v in value]) if len(value) < 2 else np.asarray(value).astype(str)
    change = np.flatnonzero(versions[1:] != versions[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(versions)]])
    return [
        {"version": str(versions[s]), "start": int(s), "end": int(e)} for s, e in zip(starts.tolist(), ends.tolist())
    ]


class SglangGenerate(Format):
    name = "sglang_generate"
    description = "SGLang native /generate output (meta_info with output_token_logprobs triples)"

    def detect(self, obj: Any) -> bool:
        return (
            isinstance(obj, dict)
            and isinstance(obj.get("meta_info"), dict)
            and isinstance(obj["meta_info"].get("finish_reason"), (dict, type(None)))
            and ("output_ids" in obj or "output_token_logprobs" in obj["meta_info"] or "text" in obj)
        )

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        obj = as_dict(obj, "record")
        meta = as_dict(obj.get("meta_info"), "meta_info")
        request_id = meta.get("id") or obj.get("rid") or obj.get("id")
        if not isinstance(request_id, str) or not request_id:
            raise Quarantined("missing_request_id", "meta_info has no 'id'")
        index = opt_int(obj.get("index")) or 0
        try:
            return [self._sample(obj, meta, request_id, index, options)]
        except Quarantined as q:
            q.choice_index = index
            return [q]

    def _sample(
        self, obj: dict[str, Any], meta: dict[str, Any], request_id: str, index: int, options: ParseOptions
    ) -> Sample:
        out_lp_raw = meta.get("output_token_logprobs")
        if out_lp_raw is None:
            if obj.get("output_ids") is None:
                raise Quarantined("no_token_ids", "no output_ids and no output_token_logprobs")
            raise Quarantined("no_logprobs", "no output_token_logprobs (request return_logprob=true)")
        lps, ids = _columns(as_list(out_lp_raw, "output_token_logprobs"), "output_token_logprobs")
        completion = token_id_array(list(ids), "output_token_logprobs ids")
        logprobs = logprob_array(list(lps), "output_token_logprobs logprobs")
        if obj.get("output_ids") is not None:
            output_ids = token_id_array(obj["output_ids"], "output_ids")
            if len(output_ids) != len(completion) or not output_ids.equals(completion):
                raise Quarantined("token_mismatch", "output_ids disagree with output_token_logprobs ids")

        prompt_raw = obj.get("input_ids", meta.get("input_ids", obj.get("prompt_token_ids")))
        if prompt_raw is None and isinstance(meta.get("input_token_logprobs"), list):
            _, prompt_ids = _columns(meta["input_token_logprobs"], "input_token_logprobs")
            prompt_raw = list(prompt_ids)
        if prompt_raw is None:
            raise Quarantined(
                "no_token_ids",
                "no prompt IDs (echo input_ids or request logprob_start_len=0 with return_logprob)",
            )
        prompt = token_id_array(prompt_raw, "prompt ids")
        topk_ids, topk_logprobs = _heads(meta.get("output_top_logprobs"), len(completion))
        spans = version_spans(meta.get("weight_versions"), len(completion))
        session_id, turn = session_of(obj)
        return Sample(
            request_id=request_id,
            choice_index=index,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=logprobs,
            finish_reason=finish_reason(meta.get("finish_reason")),
            session_id=session_id,
            turn=turn,
            group_key=group_key_of(obj, options),
            policy_version=policy_version_of(
                meta.get("weight_version"),
                meta.get("model_version"),
                spans[-1]["version"] if spans else None,
                options=options,
            ),
            policy_version_spans=spans,
            model=obj.get("model") if isinstance(obj.get("model"), str) else None,
            created_at_us=timestamp_us(obj.get("created", meta.get("created"))),
            topk_ids=topk_ids,
            topk_logprobs=topk_logprobs,
            temperature=opt_float(obj.get("temperature")),
            completion_text=obj.get("text") if isinstance(obj.get("text"), str) else None,
        )
