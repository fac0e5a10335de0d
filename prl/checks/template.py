"""``template`` check: with ``messages`` and a chat template, ``apply_chat_template(messages,
add_generation_prompt=True)`` encoded without added special tokens must equal ``prompt_token_ids``.

``messages`` is the JSON the server received: a list of messages, or an object with ``messages`` (and optional
``tools``). Rendering happens once per distinct ``messages`` text (samples of a group share it).

Reasons: ``template_prompt`` (drift) at the first prompt position where the rendered IDs differ (e.g. a
reasoning template that strips earlier ``<think>`` blocks); ``template_error`` (warn) when the messages cannot
be parsed or rendered.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.tokenizer import CheckTokenizer

WINDOW_BEFORE = 3
WINDOW_AFTER = 6


def parse_messages(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) from the stored ``messages`` JSON. Raises ValueError when it is neither form."""
    value = orjson.loads(text)
    tools = None
    if isinstance(value, dict):
        tools = value.get("tools")
        value = value.get("messages")
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ValueError("messages is not a list of message objects")
    if tools is not None and not isinstance(tools, list):
        raise ValueError("tools is not a list")
    return value, tools


@dataclass
class TemplateChecker:
    """Renders and encodes each distinct ``messages`` once (cache of at most ``max_entries``)."""

    tok: CheckTokenizer
    max_entries: int = 1 << 16
    cache: dict[bytes, list[int] | str] = field(default_factory=dict)
    rendered: int = 0

    def _render_missing(self, texts: dict[bytes, str]) -> None:
        ok_keys: list[bytes] = []
        ok_texts: list[str] = []
        for key, text in texts.items():
            try:
                messages, tools = parse_messages(text)
                ok_texts.append(self.tok.render(messages, tools))
                ok_keys.append(key)
            except Exception as exc:  # a template error is a finding, not a crash
                self.cache[key] = f"{type(exc).__name__}: {exc}"[:300]
        self.rendered += len(texts)
        for key, ids in zip(ok_keys, self.tok.encode_batch(ok_texts), strict=False):
            self.cache[key] = ids

    def check(self, batch: TokenBatch, use_R: np.ndarray) -> Findings:
        out = Findings()
        if self.tok.template is None:
            return out
        column = batch.record.column("messages").to_pylist()
        rows = [r for r in np.flatnonzero(use_R).tolist() if column[r] is not None]
        keys = {r: hashlib.blake2b(column[r].encode("utf-8"), digest_size=16).digest() for r in rows}
        missing = {k: column[r] for r, k in keys.items() if k not in self.cache}
        if len(self.cache) + len(missing) > self.max_entries:
            for old in list(itertools.islice(iter(self.cache), len(self.cache) // 2 + len(missing))):
                del self.cache[old]
        if missing:
            self._render_missing(missing)
        for r in rows:
            got = self.cache[keys[r]]
            if isinstance(got, str):
                out.add_one(r, "template_error", -1, {"error": got})
                continue
            prompt = batch.prompt.row(r)
            if len(got) == len(prompt) and got == prompt.tolist():
                continue
            b = np.asarray(got, dtype=np.int64)
            m = min(len(prompt), len(b))
            diff = np.flatnonzero(prompt[:m] != b[:m])
            at = int(diff[0]) if len(diff) else m
            start = max(0, at - WINDOW_BEFORE)
            out.add_one(
                r,
                "template_prompt",
                at,
                {
                    "where": "prompt",
                    "window_start": start,
                    "ids": prompt[start : at + WINDOW_AFTER].tolist(),
                    "rendered": got[start : at + WINDOW_AFTER],
                    "rendered_len": len(got),
                    "prompt_len": len(prompt),
                },
            )
        return out
