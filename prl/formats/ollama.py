"""Ollama's native API: ``/api/generate`` and ``/api/chat`` responses, whole or as an NDJSON stream.

A response (``api/types.go``: ``GenerateResponse``, ``ChatResponse``)::

    {"model": "qwen2.5vl:7b", "created_at": "2025-08-03T18:54:41.2149398Z", "response": "A rabbit is ...",
     "done": true, "done_reason": "stop", "context": [151644, 8948, ...], "prompt_eval_count": 28,
     "eval_count": 25, "logprobs": [{"token": "A", "logprob": -0.01, "top_logprobs": [...]}], ...}

``/api/chat`` has ``message`` instead of ``response`` and no ``context``. A stream is one such object per line,
``"done": false`` with a piece of text each, then the last one with ``"done": true`` and the counts.

None of them holds the token IDs the model sampled. ``logprobs`` entries name tokens by their text. ``context``
is not the sampled IDs either: the server makes it after generating, by tokenizing the prompt and the generated
text again (``server/routes.go``, ``GenerateHandler``: ``Tokenize(prompt + response)``), and it leaves out what
that text does not hold (a recorded stream of 64 sampled tokens, ``eval_count`` 64, ends in a context of only
63 tokens after its 51 prompt tokens). Since prl never trains on re-tokenized text, every Ollama response is
quarantined as ``no_token_ids``, one row per response: :meth:`Ollama.frame` joins the lines of a stream into
one record (a stream cut before its ``"done": true`` line is ``truncated_stream``, or left for a later run when
its file is still being written).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from prl.formats.base import Format, ParseOptions, Quarantined, RawRecord, Sample, decode_json_line, joined_record

STREAM_KEY = "_ollama_stream"
"""The key of a framed stream: its chunks, in order."""
DONE_KEY = "_ollama_done"
"""Whether a framed stream reached its ``"done": true`` line."""

RETOKENIZED = (
    "Ollama's 'context' is the prompt and the generated text tokenized again after generation "
    "(server/routes.go GenerateHandler), not the sampled token IDs, and its logprobs name tokens by text; "
    "text is never retokenized (sample with an engine that returns token IDs: vLLM, SGLang, TGI details, "
    "llama.cpp's /completion)"
)


def is_response(obj: Any) -> bool:
    """One Ollama ``/api/generate`` or ``/api/chat`` response object (or stream chunk)."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("done"), bool)
        and isinstance(obj.get("model"), str)
        and "created_at" in obj
        and ("response" in obj or isinstance(obj.get("message"), dict))
        and "choices" not in obj
    )


class Ollama(Format):
    """Ollama ``/api/generate`` and ``/api/chat`` responses and NDJSON streams: no sampled token IDs
    (quarantined as ``no_token_ids``, one row per response)."""

    name: ClassVar[str] = "ollama"
    description: ClassVar[str] = "Ollama /api/generate and /api/chat responses and NDJSON streams (quarantined)"

    def detect(self, obj: Any) -> bool:
        if isinstance(obj, dict) and isinstance(obj.get(STREAM_KEY), list):
            return True
        return is_response(obj)

    def frame(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """One record per response: a line of its own, or a stream's ``"done": false`` lines joined with its
        ``"done": true`` line (of the same model). Lines that are not Ollama responses are records of their own;
        one that comes while a stream is open ends that stream, cut (``truncated_stream``)."""
        chunks: list[RawRecord] = []
        size = 0  # bytes of the source since the open stream's first line
        for line_no, raw in lines:
            if chunks:
                size += len(raw) + 1
            if not raw.strip():
                continue
            record = decode_json_line(line_no, raw)
            chunk = record.obj if record.error is None and is_response(record.obj) else None
            if chunk is not None and chunk["done"] is False:
                if not chunks:
                    size = len(raw) + 1
                chunks.append(record)
                continue
            if chunks and chunk is not None and chunk["model"] == chunks[0].obj["model"]:
                chunks.append(record)
                yield joined_record(chunks, STREAM_KEY, DONE_KEY, done=True)
                chunks = []
                continue
            if chunks:
                yield joined_record(chunks, STREAM_KEY, DONE_KEY, done=False)
                chunks = []
            yield record
        if chunks:
            open_stream = joined_record(chunks, STREAM_KEY, DONE_KEY, done=False)
            open_stream.unfinished = size
            yield open_stream

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        if isinstance(obj, dict) and isinstance(obj.get(STREAM_KEY), list):
            if not obj.get(DONE_KEY):
                raise Quarantined("truncated_stream", 'the Ollama stream ended before its "done": true line')
        elif not is_response(obj):
            raise Quarantined("unknown_format", "not an Ollama response")
        elif obj["done"] is False:
            raise Quarantined("truncated_stream", "an Ollama stream chunk without the rest of its stream")
        raise Quarantined("no_token_ids", RETOKENIZED)
