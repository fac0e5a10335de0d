"""Hugging Face TGI's native ``/generate_stream``: server-sent events, one token each (TGI ``router/src/lib.rs``:
``StreamResponse``, ``StreamDetails``)::

    data:{"index":1,"token":{"id":13,"text":"\\n","logprob":-0.53,"special":false},"generated_text":null,"details":null}
    ...
    data:{"index":20,"token":{...},"generated_text":"...","details":{"finish_reason":"length","generated_tokens":20,
          "seed":null,"input_length":9}}

(``top_tokens`` beside ``token`` when the request asks for them; ``details`` only with ``details: true``.) A
stream ends with the event whose ``generated_text`` is set; TGI sends no ``[DONE]``. :meth:`TgiStream.frame` joins
a stream's events into one record (blank lines, ``event:`` / ``id:`` / ``retry:`` fields and ``:`` comments are
ignored), and :meth:`TgiStream.parse` reads it as the ``/generate`` response with ``details`` that the same
request gives unstreamed (:class:`prl.formats.tgi.Tgi`): same token IDs, logprobs and heads. The stream carries
no prompt IDs (no ``prefill``). A stream cut before its last event is ``truncated_stream``, or left for a later
run when its file is still being written.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from prl.formats.base import Format, ParseOptions, Quarantined, RawRecord, Sample, decode_json_line, joined_record
from prl.formats.tgi import Tgi

EVENTS_KEY = "_tgi_events"
"""The key of a framed stream: its events, in order."""
DONE_KEY = "_tgi_done"
"""Whether a framed stream reached its last event (``generated_text`` set)."""

_IGNORED = (b"event:", b"id:", b"retry:", b":")


def is_event(obj: Any) -> bool:
    """One ``/generate_stream`` event: an ``index``, a ``token`` object and a ``generated_text`` key."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("token"), dict)
        and type(obj.get("index")) is int
        and "generated_text" in obj
        and "choices" not in obj
    )


class TgiStream(Format):
    """TGI ``/generate_stream`` captures, read as the ``/generate`` response of the same request."""

    name: ClassVar[str] = "tgi_stream"
    description: ClassVar[str] = "Hugging Face TGI /generate_stream SSE: data:{index, token{id, logprob}} events"

    def detect(self, obj: Any) -> bool:
        return (isinstance(obj, dict) and isinstance(obj.get(EVENTS_KEY), list)) or is_event(obj)

    def frame(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[RawRecord]:
        """One record per stream; a ``data:`` line that is not a stream event is a record of its own, and one
        that comes while a stream is open ends that stream, cut."""
        events: list[RawRecord] = []
        size = 0  # bytes of the source since the open stream's first line
        for line_no, raw in lines:
            if events:
                size += len(raw) + 1
            line = raw.strip()
            if not line or line.startswith(_IGNORED):
                continue
            payload = line[5:] if line.startswith(b"data:") else line
            record = decode_json_line(line_no, payload.strip())
            event = record.obj if record.error is None and is_event(record.obj) else None
            if event is None:
                if events:
                    yield joined_record(events, EVENTS_KEY, DONE_KEY, done=False)
                    events = []
                yield record
                continue
            if not events:
                size = len(raw) + 1
            events.append(record)
            if event["generated_text"] is not None:
                yield joined_record(events, EVENTS_KEY, DONE_KEY, done=True)
                events = []
        if events:
            open_stream = joined_record(events, EVENTS_KEY, DONE_KEY, done=False)
            open_stream.unfinished = size
            yield open_stream

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        if is_event(obj):
            obj = {EVENTS_KEY: [obj], DONE_KEY: obj["generated_text"] is not None}
        if not (isinstance(obj, dict) and isinstance(obj.get(EVENTS_KEY), list)):
            raise Quarantined("unknown_format", "not a TGI /generate_stream event")
        if not obj.get(DONE_KEY):
            raise Quarantined("truncated_stream", "the stream ended before its event with generated_text")
        return Tgi().parse(joined(obj[EVENTS_KEY]), options)


def joined(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``/generate`` response (``generated_text`` + ``details``) a stream's events add up to."""
    last = events[-1]
    stream_details: dict[str, Any] = last["details"] if isinstance(last.get("details"), dict) else {}
    details: dict[str, Any] = {
        "finish_reason": stream_details.get("finish_reason"),
        "generated_tokens": stream_details.get("generated_tokens", len(events)),
        "seed": stream_details.get("seed"),
        "prefill": [],
        "tokens": [event["token"] for event in events],
    }
    if any(event.get("top_tokens") is not None for event in events):
        details["top_tokens"] = [event.get("top_tokens") or [] for event in events]
    return {"generated_text": last.get("generated_text"), "details": details}
