"""The Arrow schemas of every table prl writes, in one place (docs/design.md).

Names follow what arrays are aligned to: ``completion_*`` arrays have one entry per completion token,
``topk_*`` arrays are ``[completion_len][k]``.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1"

TOKEN_IDS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())
VERSION_SPAN = pa.struct([("version", pa.string()), ("start", pa.int32()), ("end", pa.int32())])
TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")
TIMESTAMP_US = pa.timestamp("us", tz="UTC")
"""A sample's ``created_at`` keeps the microseconds it was given; the times prl stamps itself are milliseconds."""

FINISH_REASONS = ("stop", "length", "tool_calls", "abort", "error")

TRACES = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("choice_index", pa.int32(), nullable=False),
        pa.field("session_id", pa.string()),
        pa.field("turn", pa.int32()),
        pa.field("agent_id", pa.string()),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("policy_version", pa.string()),
        pa.field("policy_version_spans", pa.list_(VERSION_SPAN)),
        pa.field("model", pa.string()),
        pa.field("created_at", TIMESTAMP_US),
        pa.field("prompt_token_ids", TOKEN_IDS, nullable=False),
        pa.field("completion_token_ids", TOKEN_IDS, nullable=False),
        pa.field("completion_logprobs", LOGPROBS, nullable=False),
        pa.field("completion_mask", pa.list_(pa.bool_())),
        pa.field("topk_ids", pa.list_(TOKEN_IDS)),
        pa.field("topk_logprobs", pa.list_(LOGPROBS)),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("temperature", pa.float32()),
        pa.field("top_p", pa.float32()),
        pa.field("top_k", pa.int32()),
        pa.field("logprobs_mode", pa.string()),
        pa.field("messages", pa.string()),
        pa.field("completion_text", pa.string()),
        pa.field("record_digest", pa.string(), nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("source_format", pa.string(), nullable=False),
        pa.field("ingested_at", TIMESTAMP_MS, nullable=False),
    ]
)
"""One row per sampled completion. A trajectory is the rows of one (``session_id``, ``agent_id``): the calls one
agent made inside a session (``agent_id`` null: the session's calls that name no agent). ``record_digest`` is a sha256 over the sample's token IDs and logprobs:
re-reading the same record is recognised and skipped, a different record under a known ``sample_id`` is
quarantined as ``duplicate_sample_id``."""

QUARANTINE = pa.schema(
    [
        pa.field("quarantine_id", pa.string(), nullable=False),
        pa.field("table", pa.string(), nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("source_format", pa.string()),
        pa.field("sample_id", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("raw", pa.string()),
        pa.field("raw_truncated", pa.bool_(), nullable=False),
        pa.field("quarantined_at", TIMESTAMP_MS, nullable=False),
    ]
)
"""A record that was read and not kept, with why. ``quarantine_id`` is a digest of (source content sha256,
line, choice, reason): re-reading a file never quarantines the same record twice. ``raw`` holds the first
``RAW_LIMIT`` characters of the line."""

RAW_LIMIT = 4096

REWARDS = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("created_at", TIMESTAMP_MS, nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("ingested_at", TIMESTAMP_MS, nullable=False),
        pa.field("event_id", pa.string()),
    ]
)
"""Reward events. The latest ``created_at`` (then the latest ingest) per (sample_id, name) wins. ``event_id``
is the event's identity, a digest of its content (:mod:`prl.event_ids`): an event read again, from
the same file, a grown one, a rotated one or a renamed copy, is recognised by it (nullable only because the column
was added to older tables: ``prl maintain --upgrade`` gives their rows theirs)."""

REF_LOGPROBS = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("ref_model", pa.string(), nullable=False),
        pa.field("ref_logprobs", LOGPROBS, nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("ingested_at", TIMESTAMP_MS, nullable=False),
        pa.field("event_id", pa.string()),
    ]
)
"""Reference-model log p(token), one entry per completion token; ``event_id`` as in ``rewards``."""

VERDICTS = ("ok", "note", "warn", "drift", "invalid")

CHECKS = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("tokenizer_fingerprint", pa.string(), nullable=False),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("reasons", pa.list_(pa.string()), nullable=False),
        pa.field("first_divergence", pa.int32()),
        pa.field("prefix_status", pa.string()),
        pa.field("heads_ok", pa.bool_()),
        pa.field("detail", pa.string()),
        pa.field("source_format", pa.string()),
        pa.field("model", pa.string()),
        pa.field("policy_version", pa.string()),
        pa.field("checked_at", TIMESTAMP_MS, nullable=False),
    ]
)
"""One verdict per (sample_id, tokenizer_fingerprint). ``first_divergence`` is a completion (or prompt, per the
reason) token position; ``prefix_status`` is CLEAN / REALIGN / FORK for multi-turn samples; ``detail`` is a
short JSON object with the evidence a person reads."""

SHARD = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("policy_version", pa.string()),
        pa.field("policy_step", pa.int64()),
        pa.field("policy_version_spans", pa.list_(VERSION_SPAN)),
        pa.field("staleness", pa.int64()),
        pa.field("temperature", pa.float32()),
        pa.field("top_p", pa.float32()),
        pa.field("top_k", pa.int32()),
        pa.field("logprobs_mode", pa.string()),
        pa.field("input_ids", TOKEN_IDS, nullable=False),
        pa.field("prompt_len", pa.int32(), nullable=False),
        pa.field("loss_mask", pa.list_(pa.bool_()), nullable=False),
        pa.field("behavior_logprobs", LOGPROBS, nullable=False),
        pa.field("ref_logprobs", LOGPROBS),
        pa.field("kl", LOGPROBS),
        pa.field("token_advantages", LOGPROBS, nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("advantage", pa.float64(), nullable=False),
        pa.field("group_size", pa.int32(), nullable=False),
        pa.field("topk_ids", pa.list_(TOKEN_IDS)),
        pa.field("topk_logprobs", pa.list_(LOGPROBS)),
    ]
)
"""One row per training sample. ``input_ids`` = prompt + completion; every ``*_logprobs``, ``kl``,
``loss_mask``, ``token_advantages`` and ``topk_*`` array is completion-aligned (length = completion length).
``policy_version`` is as the trace gave it, ``policy_step`` its integer step (``"step-120"`` → 120, null when it has
none), ``policy_version_spans`` the per-token versions when weights changed mid-sample; ``temperature``,
``top_p``, ``top_k`` and ``logprobs_mode`` are the sampling settings the trace recorded (null when unknown), what
a trainer needs to recompute comparable logprobs. No ``behavior_logprobs``, ``ref_logprobs``, ``kl`` or
``token_advantages`` value is null or non-finite where ``loss_mask`` is true."""

TABLES = {
    "traces": TRACES,
    "quarantine": QUARANTINE,
    "rewards": REWARDS,
    "ref_logprobs": REF_LOGPROBS,
    "checks": CHECKS,
}


def leaf_paths(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    """Every Parquet leaf column of ``schema`` as ``(dotted path, Arrow type)``, in order (lists as
    ``name.list.element``, structs as ``name.child``): the names Parquet writer options take."""

    def walk(path: str, typ: pa.DataType) -> list[tuple[str, pa.DataType]]:
        if pa.types.is_list(typ) or pa.types.is_large_list(typ):
            return walk(f"{path}.list.element", typ.value_type)
        if pa.types.is_struct(typ):
            return [leaf for child in typ for leaf in walk(f"{path}.{child.name}", child.type)]
        return [(path, typ)]

    return [leaf for f in schema for leaf in walk(f.name, f.type)]


def float_leaves(schema: pa.Schema) -> list[str]:
    """The floating-point leaf columns of ``schema`` (dotted paths): written with byte-stream-split encoding."""
    return [path for path, typ in leaf_paths(schema) if pa.types.is_floating(typ)]
