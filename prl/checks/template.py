"""``template`` check: with ``messages`` and a chat template, ``apply_chat_template(messages,
add_generation_prompt=True)`` encoded without added special tokens must equal ``prompt_token_ids``.

``messages`` is the JSON the server received: a list of messages, or an object with ``messages`` (and optional
``tools``). Rendering happens once per distinct ``messages`` text (samples of a group share it).

Reasons: ``template_prompt`` (drift) at the first prompt position where the rendered IDs differ (e.g. a
reasoning template that strips earlier ``<think>`` blocks); ``template_error`` (warn) when the messages cannot
be parsed or rendered; ``template_budget`` (warn) when rendering them takes too long, too much memory or renders
too much text (:mod:`prl.checks.template_worker`): a template is code, and a runaway one must not stall the run.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

import numpy as np

from prl.bounds import TEMPLATE_TIMEOUTS
from prl.checks.batch import TokenBatch
from prl.checks.findings import Findings
from prl.checks.template_worker import Rendered, TemplateWorker, parse_messages
from prl.checks.tokenizer import CheckTokenizer

WINDOW_BEFORE = 3
WINDOW_AFTER = 6


@dataclass
class TemplateChecker:
    """Renders and encodes each distinct ``messages`` once (cache of at most ``max_entries``), in a
    :class:`TemplateWorker` under a time, memory and size budget."""

    tok: CheckTokenizer
    max_entries: int = 1 << 16
    cache: dict[bytes, list[int] | tuple[str, str]] = field(default_factory=dict)
    """messages digest → prompt IDs as rendered, or (reason, message) when it did not render."""
    rendered: int = 0
    max_timeouts: int = TEMPLATE_TIMEOUTS
    """Conversations of the run that may break the render time budget before the rest get ``template_budget``
    unrendered (:mod:`prl.checks.template_worker`)."""
    worker: TemplateWorker = field(init=False)

    def __post_init__(self) -> None:
        self.worker = TemplateWorker(max_timeouts=self.max_timeouts)

    def _render_missing(self, texts: dict[bytes, str]) -> None:
        assert self.tok.template is not None
        keys = list(texts)
        try:
            outcomes = self.worker.render(
                self.tok.template, self.tok.template_variables(), self.tok.path, [texts[k] for k in keys]
            )
        except RuntimeError as exc:  # no worker: every conversation is a template error, the run goes on
            outcomes = [Rendered(error=str(exc))] * len(keys)
        ok_keys: list[bytes] = []
        ok_texts: list[str] = []
        for key, outcome in zip(keys, outcomes, strict=True):
            if outcome.text is not None:
                ok_keys.append(key)
                ok_texts.append(outcome.text)
            elif outcome.budget is not None:
                self.cache[key] = ("template_budget", outcome.budget)
            else:
                self.cache[key] = ("template_error", outcome.error or "rendering failed")
        self.rendered += len(texts)
        for key, ids in zip(ok_keys, self.tok.encode_batch(ok_texts), strict=True):
            self.cache[key] = ids

    def close(self) -> None:
        """Stop the render worker (a later check starts a new one)."""
        self.worker.close()

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
            if isinstance(got, tuple):
                out.add_one(r, got[0], -1, {"error": got[1]})
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


__all__ = ["TemplateChecker", "parse_messages"]
