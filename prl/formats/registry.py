"""The known wire formats, in detection order, and per-file detection."""

from __future__ import annotations

from typing import Any

from prl.errors import FormatDetectionError, UsageError
from prl.formats.base import Format, RawRecord
from prl.formats.envelopes import LiteLLMLog, OpenAIBatch, ProxyCapture
from prl.formats.openai_text import OpenAIText
from prl.formats.rollouts import PrimeRL, SkyRL, Slime, Verl
from prl.formats.sglang import SglangGenerate
from prl.formats.sse.exact import Sse
from prl.formats.tgi import Tgi
from prl.formats.vllm import VllmChat, VllmCompletions
from prl.formats.vllm_generate import VllmGenerate, VllmRequestOutput

FORMATS: list[Format] = [
    OpenAIBatch(),
    ProxyCapture(),
    LiteLLMLog(),
    VllmChat(),
    VllmCompletions(),
    SglangGenerate(),
    Sse(),
    VllmGenerate(),
    VllmRequestOutput(),
    Tgi(),
    Verl(),
    Slime(),
    SkyRL(),
    PrimeRL(),
    OpenAIText(),
]
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


def detect_file(uri: str, lines: list[tuple[int, bytes]]) -> Format:
    """The format of a file, from its first lines: each format frames them and sniffs the result.

    Raises :class:`FormatDetectionError` naming every format tried when none matches.
    """
    framed: dict[Any, list[RawRecord]] = {}  # formats that frame alike (one JSON per line) decode the head once
    for fmt in FORMATS:
        framing = type(fmt).frame
        if framing not in framed:
            framed[framing] = list(fmt.frame(iter(lines)))
        head = framed[framing]
        if head and fmt.sniff(head):
            return fmt
    raise FormatDetectionError(
        f"{uri}: no known format matches its first records (tried: {', '.join(names())}); pass --format to force one"
    )
