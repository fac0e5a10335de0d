"""verifiers ``vf-eval`` results: ``outputs/evals/<env>--<model>/<run>/results.jsonl``, one rollout per line::

    {"id": 0, "prompt": [{"role": "user", "content": "..."}], "completion": [{"role": "assistant", ...}],
     "task": "default", "info": {...}, "answer": "...", "reward": 1.0, "<metric>": 1.0, ...}

(``example_id`` instead of ``id`` in other versions; ``prompt`` and ``completion`` are strings in completion
environments; ``generation_ms``, ``scoring_ms``, ``total_ms`` in newer ones.) The records hold the chat
messages, decoded text, and no token IDs: they are recognised, so that a results file is not of an unknown
format, and each record is quarantined as ``no_token_ids``. Token IDs of verifiers rollouts are read from the
traces prime-rl writes (:mod:`prl.formats.prime_rl`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from prl.formats.base import Format, ParseOptions, Quarantined, Sample


def _text_or_messages(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(m, dict) for m in value[:2]))


class VerifiersEval(Format):
    """``vf-eval`` ``results.jsonl`` records: messages and rewards, no token IDs (quarantined)."""

    name: ClassVar[str] = "verifiers_eval"
    description: ClassVar[str] = "verifiers vf-eval results.jsonl: prompt/completion messages + reward (quarantined)"

    def detect(self, obj: Any) -> bool:
        return (
            isinstance(obj, dict)
            and "reward" in obj
            and ("id" in obj or "example_id" in obj)
            and _text_or_messages(obj.get("prompt"))
            and _text_or_messages(obj.get("completion"))
        )

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        raise Quarantined(
            "no_token_ids",
            "a vf-eval results.jsonl record holds chat messages and rewards, not the sampled token IDs; text is "
            "never retokenized (ingest the rollout traces prime-rl writes, which carry prompt and completion IDs)",
        )
