"""The known wire formats, in detection order, and per-file detection."""

from __future__ import annotations

from typing import Any, ClassVar

from prl.errors import FormatDetectionError, UsageError
from prl.formats.base import Format, ParseOptions, Quarantined, RawRecord, Sample
from prl.formats.envelopes import LiteLLMLog, OpenAIBatch, ProxyCapture
from prl.formats.nemo_gym import NemoGym
from prl.formats.ollama import Ollama
from prl.formats.openai_text import OpenAIText
from prl.formats.prime_rl import PrimeRL
from prl.formats.rollouts import SkyRL, Slime, Verl
from prl.formats.sglang import SglangGenerate
from prl.formats.sse.exact import Sse
from prl.formats.text_dumps import TextDump
from prl.formats.tgi import Tgi
from prl.formats.tgi_stream import TgiStream
from prl.formats.verifiers_eval import VerifiersEval
from prl.formats.vllm import VllmChat, VllmCompletions
from prl.formats.vllm_generate import VllmGenerate, VllmRequestOutput

BODY_FORMATS: list[Format] = [
    NemoGym(),
    VllmChat(),
    VllmCompletions(),
    SglangGenerate(),
    Sse(),
    VllmGenerate(),
    VllmRequestOutput(),
    TgiStream(),
    Tgi(),
    Ollama(),
    Verl(),
    Slime(),
    SkyRL(),
    PrimeRL(),
    VerifiersEval(),
    TextDump(),
    OpenAIText(),
]
"""Formats a record or an envelope's body may be in."""

FORMATS: list[Format] = [OpenAIBatch(BODY_FORMATS), ProxyCapture(BODY_FORMATS), LiteLLMLog(BODY_FORMATS), *BODY_FORMATS]
"""Detection order matters: envelopes first (they wrap other formats), text-only formats last. ``sse`` comes
after ``openai_completions``: a streamed ``text_completion`` chunk and a whole response share ``object``, and
only framing (``data:`` lines) tells a stream capture apart."""


def names() -> list[str]:
    return [f.name for f in FORMATS]


def by_name(name: str) -> Format:
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise UsageError(f"unknown format {name!r}; known formats: {', '.join(names())}")


def detect_record(obj: Any) -> Format | None:
    """The first format whose ``detect`` accepts one decoded record."""
    for fmt in FORMATS:
        if fmt.detect(obj):
            return fmt
    return None


class PerRecord(Format):
    """A JSON-lines file read record by record: each record by the first format that detects it, so a proxy
    log mixing endpoints (chat and text completions, SGLang routes, envelopes) keeps every record.
    ``first`` is the format its first records are in; :meth:`reader` names the format of each record."""

    name: ClassVar[str] = "jsonl"
    description: ClassVar[str] = "one JSON record per line, format detected per record"

    def __init__(self, first: Format | None) -> None:
        self.first = first

    def detect(self, obj: Any) -> bool:
        return detect_record(obj) is not None

    def reader(self, obj: Any) -> Format:
        """The format of one record; ``unknown_format`` when none detects it."""
        fmt = detect_record(obj)
        if fmt is None:
            raise Quarantined("unknown_format", f"no known format matches this record (tried: {', '.join(names())})")
        return fmt

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        return self.reader(obj).parse(obj, options)


UNREADABLE_JSON = frozenset({"too_deep", "line_too_long"})
"""Decode failures of lines that are JSON lines, only too large or too deep to decode."""


def per_record(fmt: Format) -> Format:
    """How an auto-detected file is read: a format framing one JSON document per line as :class:`PerRecord`
    (every record detected again); one with its own framing (SSE) as itself."""
    if isinstance(fmt, PerRecord) or type(fmt).frame is not Format.frame:
        return fmt
    return PerRecord(fmt)


def detect_file(uri: str, lines: list[tuple[int, bytes]]) -> Format:
    """The format of a file, from its first lines: each format frames them and sniffs the result. JSON lines
    that no format sniffs are read record by record (:class:`PerRecord`): a record of no known format is
    quarantined as ``unknown_format``, so a file of unknown records is one quarantine row per record.

    Raises :class:`FormatDetectionError` naming every format tried when the first lines are not JSON at all.
    """
    framed: dict[Any, list[RawRecord]] = {}  # formats that frame alike (one JSON per line) decode the head once
    for fmt in FORMATS:
        framing = type(fmt).frame
        if framing not in framed:
            framed[framing] = list(fmt.frame(iter(lines)))
        head = framed[framing]
        if head and fmt.sniff(head):
            return fmt
    json_head = framed.get(Format.frame, [])
    if any(r.error is None for r in json_head):
        return PerRecord(None)  # JSON lines of no known format (yet): each record is read, or is unknown_format
    if json_head and all(r.error is not None and r.error.reason in UNREADABLE_JSON for r in json_head):
        return PerRecord(None)  # JSON lines too big or too deep to decode: each is quarantined with its reason
    raise FormatDetectionError(
        f"{uri}: no known format matches its first records (tried: {', '.join(names())}); pass --format to force one"
    )
