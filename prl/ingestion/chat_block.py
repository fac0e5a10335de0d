"""A block of JSON lines parsed by one Arrow call into the columns of OpenAI chat and text completions.

The columnar road (:mod:`prl.ingestion.columnar`) reads a source block of whole lines with
``pyarrow.json.read_json`` and :data:`CHAT_BLOCK_SCHEMA`, so that no Python object is built per record.
A line is handed to Arrow only where Arrow's reading of it is exactly what ``orjson`` (with the standard
library's ``json`` for what orjson refuses) and the record's reader see; every other line is left to the
per-record road, which reads it as always:

- the line starts with ``{`` and ends with ``}`` (no blank line, no other top-level value, no BOM, no ``\\r``);
- it is at most :data:`MAX_LINE_BYTES` long, and within the record limit
  (:data:`prl.formats.base.MAX_RECORD_BYTES`): longer records are the per-record road's, which bounds a
  line's memory and quarantines one over the limit as ``line_too_long``;
- its nesting is at most :data:`MAX_DEPTH` deep (orjson refuses depth > 1024 as ``too_deep``; Arrow does not):
  a line of at most that many ``[`` / ``{`` bytes is, and the nesting of a longer one is counted outside its
  strings;
- it is valid UTF-8 (Arrow does not check; the decoders refuse it as ``malformed_json``);
- Arrow reads it alone as one row: a parse error, a value of another type than the schema's (a boolean
  logprob, a float token ID, a string model), a key given twice, two documents on one line all make Arrow refuse
  it (of a block that fails, the line the parser names goes to the per-record road and the lines around it are
  read again; should they fail again, they go too);
- none of the top-level keys of :data:`ABSENT_KEYS` (what envelope formats detect a record by) holds a value
  other than null (their fields are ``null`` typed, so any value fails the read). Two of those formats claim a
  record by a key's presence alone, even with a null value, which Arrow cannot tell from absence: a line whose
  text holds ``custom_id`` or ``response`` anywhere is left to the per-record road, and so is one holding a
  ``\\u00XX`` escape of an ASCII character (which could spell such a key);
- in a block holding text completions, its text does not set a ``prompt_token_ids`` to null (a text
  completion's choice whose prompt is null has none for its reader, which Arrow cannot tell from absent).

A line whose text names one of :data:`RECORD_KEYS` (a session, a turn, metadata, messages, a version, an
agent) is read by Arrow all the same, and marked: the columnar road reads its record's own fields from the
decoded record (:mod:`prl.ingestion.columnar`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from prl.formats import base

HEAD = pa.struct([("token", pa.string()), ("logprob", pa.float64())])
ENTRY = pa.struct([("token", pa.string()), ("logprob", pa.float64()), ("top_logprobs", pa.list_(HEAD))])
LOGPROBS = pa.struct(
    [
        ("content", pa.list_(ENTRY)),  # a chat completion's
        ("tokens", pa.list_(pa.string())),  # a text completion's
        ("token_logprobs", pa.list_(pa.float64())),
        ("top_logprobs", pa.list_(pa.null())),  # a text completion's heads are its reader's (any value fails)
    ]
)
CHOICE = pa.struct(
    [
        ("index", pa.int64()),
        ("message", pa.struct([("content", pa.string())])),
        ("text", pa.string()),
        ("finish_reason", pa.string()),
        ("token_ids", pa.list_(pa.int64())),
        ("prompt_token_ids", pa.list_(pa.int64())),
        ("logprobs", LOGPROBS),
    ]
)
RECORD_KEYS = (
    # read by the chat reader beyond a bare response (session, turn, versions, messages)
    "session_id",
    "turn",
    "metadata",
    "sglext",
    "weight_version",
    "policy_version",
    "messages",
    # where an agent may be named (prl.formats.agents)
    "agent_id",
    "agent_name",
    "agent",
    "agent_ref",
    "standard_logging_object",
    "request",
    "headers",
    "request_headers",
)
"""Keys of a record (or its choices) whose fields the chat reader takes from the decoded record."""
ABSENT_KEYS = (
    # what envelope formats detect a record by
    "custom_id",
    "response",
    "model_parameters",
    "call_type",
    "responses_create_params",
)
CHAT_BLOCK_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("object", pa.string()),
        ("created", pa.int64()),
        ("model", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int64())),
        ("choices", pa.list_(CHOICE)),
        *[(key, pa.null()) for key in ABSENT_KEYS],
    ]
)
"""What the columnar road reads of a chat or text completion; every other field is skipped (still parsed)."""

MAX_DEPTH = 512
"""Nesting a line may have: well within both decoders'."""
PRESENCE_NEEDLES = (b"custom_id", b"response")
_RECORD_KEY = '"(' + "|".join(RECORD_KEYS) + ')"'
_ASCII_ESCAPE = re.compile(rb"\\u00[2-7][0-9a-fA-F]")
_NULL_PROMPT = r'"prompt_token_ids"\s*:\s*null'
"""A text completion's choice whose ``prompt_token_ids`` is null has no prompt for its reader (which takes the
record's only where the choice has none): Arrow cannot tell null from absent, so such lines are left out."""
_ERROR_ROW = re.compile(r" in row (\d+)")

_PARSE = pj.ParseOptions(explicit_schema=CHAT_BLOCK_SCHEMA, unexpected_field_behavior="ignore")
_READ = pj.ReadOptions(use_threads=True, block_size=1 << 20)
MAX_LINE_BYTES = _READ.block_size - 1
"""Longest line (bytes, without its newline) the columnar road hands to Arrow: one Arrow read block."""


@dataclass(slots=True)
class BlockLines:
    """The lines of one block: ``starts`` / ``ends`` are int64[L] byte offsets of each line in ``data``
    (``ends`` at its ``\\n``)."""

    data: bytes
    starts: np.ndarray
    ends: np.ndarray

    def raw(self, line: int) -> bytes:
        """Line ``line``'s bytes (without its ``\\n``)."""
        return self.data[int(self.starts[line]) : int(self.ends[line])]


@dataclass(slots=True)
class ParsedBlock:
    """The lines of one block and what Arrow read of them: ``lines`` int64[T] are the indices of the lines
    Arrow read, in order, row ``i`` of ``table`` being line ``lines[i]``; ``marked`` bool[T]: the lines whose
    text names one of :data:`RECORD_KEYS`; ``texts``: by row, the JSON text a marked record of more than
    :data:`MAX_DEPTH` openers is decoded from (:meth:`Nesting.without_tokens`)."""

    text: BlockLines
    lines: np.ndarray
    table: pa.Table
    marked: np.ndarray
    texts: dict[int, bytes]


def _line_bounds(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    bytes_ = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(bytes_ == 0x0A)
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


def _candidates(data: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, Nesting | None]:
    """bool[L]: lines Arrow may read (see the module docstring), judged on their bytes; bool[L]: lines holding
    more than :data:`MAX_DEPTH` openers; and the block's :class:`Nesting` where one of those may be read."""
    bytes_ = np.frombuffer(data, dtype=np.uint8)
    nonempty = ends > starts
    first = bytes_[np.where(nonempty, starts, 0)]
    last = bytes_[np.where(nonempty, ends - 1, 0)]
    longest = min(MAX_LINE_BYTES, base.MAX_RECORD_BYTES)  # a longer record is the per-record road's limit's
    ok = nonempty & (first == 0x7B) & (last == 0x7D) & (ends - starts <= longest)
    low = bytes_ | 0x20
    openers = np.flatnonzero(low == 0x7B)  # "[" (0x5B) and "{" (0x7B)
    many = np.bincount(np.searchsorted(ends, openers), minlength=len(ends))[: len(ends)] > MAX_DEPTH
    nesting = None
    if (ok & many).any():
        nesting = Nesting.of(bytes_, low, starts, ends)
        ok &= ~many | (nesting.deepest(len(ends)) <= MAX_DEPTH)
    needles = [n for n in PRESENCE_NEEDLES if n in data]
    escapes = b"\\" in data and _ASCII_ESCAPE.search(data) is not None
    if needles or escapes:
        for i in np.flatnonzero(ok).tolist():
            line = data[starts[i] : ends[i]]
            if any(n in line for n in needles) or (escapes and _ASCII_ESCAPE.search(line) is not None):
                ok[i] = False
    return ok, many, nesting


_BLANKS = b" \t\n\r"


@dataclass(slots=True)
class Nesting:
    """The brackets of a block that stand outside strings: ``at`` int64[B] their offsets, ``line`` their
    line, ``depth`` the nesting after each (1 after a line's first ``{``, 0 after its last ``}``), ``opens``
    whether each opens; ``quotes``: the offsets of the quotes that open or close a string (a quote preceded by
    an odd run of backslashes is inside one)."""

    at: np.ndarray
    line: np.ndarray
    depth: np.ndarray
    opens: np.ndarray
    quotes: np.ndarray

    @classmethod
    def of(cls, bytes_: np.ndarray, low: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Nesting:
        """``low``: the bytes with bit 0x20 set."""
        quotes = np.flatnonzero(bytes_ == 0x22)
        escaped = quotes[(quotes > 0) & (bytes_[quotes - 1] == 0x5C)]
        if len(escaped):
            slashes = np.flatnonzero(bytes_ == 0x5C)
            run_starts = slashes[np.r_[True, np.diff(slashes) != 1]]
            run = escaped - run_starts[np.searchsorted(run_starts, escaped - 1, side="right") - 1]
            quotes = np.setdiff1d(quotes, escaped[run % 2 == 1], assume_unique=True)
        at = np.flatnonzero((low == 0x7B) | (low == 0x7D))
        line = np.searchsorted(ends, at)
        line_quotes = np.searchsorted(quotes, np.append(starts, len(bytes_)))  # quotes before each line
        outside = ((np.searchsorted(quotes, at) - line_quotes[line]) & 1) == 0
        at, line = at[outside], line[outside]
        opens = low[at] == 0x7B
        step = np.where(opens, 1, -1)
        depth = np.cumsum(step)
        if len(at):  # each line counted from its own start
            first = np.r_[0, np.flatnonzero(line[1:] != line[:-1]) + 1]
            depth -= np.repeat(depth[first] - step[first], np.diff(np.r_[first, len(at)]))
        return cls(at, line, depth, opens, quotes)

    def deepest(self, lines: int) -> np.ndarray:
        """int64[lines]: each line's deepest nesting."""
        deepest = np.zeros(lines + 1, dtype=np.int64)
        if len(self.at):
            first = np.r_[0, np.flatnonzero(self.line[1:] != self.line[:-1]) + 1]
            deepest[self.line[first]] = np.maximum.reduceat(self.depth, first)
        return deepest[:lines]

    def without_tokens(self, data: bytes, start: int, end: int, line: int) -> bytes | None:
        """Line ``line`` (``data[start:end]``, a completion Arrow read) with its token lists emptied: the value
        of its ``prompt_token_ids`` and of each choice's ``token_ids`` and ``prompt_token_ids`` made ``[]``, of
        each choice's ``logprobs`` ``{}``. Decoding that costs a fraction of the whole line and gives every
        other field as it is; None where the keys are not where a completion has them."""
        a, b = np.searchsorted(self.line, [line, line + 1])
        at, depth, opens = self.at[a:b], self.depth[a:b], self.opens[a:b]
        cuts: list[tuple[int, int, bytes]] = []
        choices = None
        for k in np.flatnonzero(opens & (depth == 2)).tolist():  # the values of the record's keys
            key, where = self._key(data, int(at[k])), int(at[k])
            if key == b"prompt_token_ids" and data[where] == 0x5B:
                cuts.append((where, self._closer(at, depth, k), b"[]"))
            elif key == b"choices" and data[where] == 0x5B:
                choices = (where, self._closer(at, depth, k))
        if choices is None:
            return None
        inside = (at > choices[0]) & (at < choices[1])
        for k in np.flatnonzero(opens & (depth == 4) & inside).tolist():  # the values of each choice's keys
            key, where = self._key(data, int(at[k])), int(at[k])
            if key in (b"token_ids", b"prompt_token_ids") and data[where] == 0x5B:
                cuts.append((where, self._closer(at, depth, k), b"[]"))
            elif key == b"logprobs" and data[where] == 0x7B:
                cuts.append((where, self._closer(at, depth, k), b"{}"))
        pieces, done = [], start
        for cut_start, cut_end, empty in sorted(cuts):
            pieces += [data[done:cut_start], empty]
            done = cut_end + 1
        pieces.append(data[done:end])
        return b"".join(pieces)

    @staticmethod
    def _closer(at: np.ndarray, depth: np.ndarray, k: int) -> int:
        """The offset of the bracket that closes bracket ``k``."""
        return int(at[k + 1 + int(np.argmax(depth[k + 1 :] == depth[k] - 1))])

    def _key(self, data: bytes, at: int) -> bytes | None:
        """The key of the object member whose value opens at ``at``; None for an array element."""
        j = at - 1
        while data[j] in _BLANKS:
            j -= 1
        if data[j] != 0x3A:  # ":"
            return None
        j -= 1
        while data[j] in _BLANKS:
            j -= 1
        closing = int(np.searchsorted(self.quotes, j))
        if closing == 0 or closing >= len(self.quotes) or self.quotes[closing] != j:
            return None
        return data[int(self.quotes[closing - 1]) + 1 : j]


def _read(buffer: bytes | memoryview) -> pa.Table | None:
    try:
        return pj.read_json(pa.BufferReader(buffer), read_options=_READ, parse_options=_PARSE)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def _joined(data: bytes, starts: np.ndarray, ends: np.ndarray, lines: np.ndarray) -> bytes:
    return b"\n".join([data[s:e] for s, e in zip(starts[lines].tolist(), ends[lines].tolist(), strict=True)]) + b"\n"


def _read_piece(
    data: bytes, starts: np.ndarray, ends: np.ndarray, part: np.ndarray
) -> tuple[pa.Table | None, int | None]:
    """Arrow's reading of the lines ``part`` in one chunk on this thread: (table, None), or (None, the row the
    parser stopped at, where its message names one; a conversion error names none)."""
    if part[-1] - part[0] + 1 == len(part):  # consecutive lines: a slice of the block
        buffer = pa.py_buffer(data)[int(starts[part[0]]) : int(ends[part[-1]]) + 1]
    else:
        buffer = pa.py_buffer(_joined(data, starts, ends, part))
    options = pj.ReadOptions(use_threads=False, block_size=buffer.size + 1)
    try:
        return pj.read_json(pa.BufferReader(buffer), read_options=options, parse_options=_PARSE), None
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        found = _ERROR_ROW.search(str(exc))
        return None, None if found is None else int(found.group(1))


def _read_lines(
    data: bytes, starts: np.ndarray, ends: np.ndarray, lines: np.ndarray
) -> list[tuple[np.ndarray, pa.Table]]:
    """Arrow's reading of ``lines`` as (lines read, their table) pieces in line order. Should the whole fail,
    the lines holding a key Arrow refuses a value of are dropped and the rest read again; should that fail at
    a line the parser names, the lines before and after it are read once more each. Lines still unread are
    left out (an Arrow call costs about a millisecond whatever its size: halving a block down to its failing
    lines would cost more than the per-record road)."""
    table = _read(data if len(lines) == len(starts) else _joined(data, starts, ends, lines))
    if table is not None and table.num_rows == len(lines):
        return [(lines, table)]
    lines = _without_absent_keys(data, starts, ends, lines)  # the likeliest failure: found without Arrow
    if not len(lines):
        return []
    table, row = _read_piece(data, starts, ends, lines)
    if table is not None and table.num_rows == len(lines):
        return [(lines, table)]
    pieces: list[tuple[np.ndarray, pa.Table]] = []
    if table is None and row is not None and row < len(lines):
        for again in (lines[:row], lines[row + 1 :]):
            if len(again):
                table, _ = _read_piece(data, starts, ends, again)
                if table is not None and table.num_rows == len(again):
                    pieces.append((again, table))
    return pieces


def _without_absent_keys(data: bytes, starts: np.ndarray, ends: np.ndarray, lines: np.ndarray) -> np.ndarray:
    """``lines`` less those whose text holds an :data:`ABSENT_KEYS` key in quotes (an envelope: Arrow refuses
    its non-null value); searched only in a block Arrow refused."""
    needles = [needle for key in ABSENT_KEYS if (needle := f'"{key}"'.encode()) in data]
    if not needles:
        return lines
    keep = [
        not any(needle in data[s:e] for needle in needles)
        for s, e in zip(starts[lines].tolist(), ends[lines].tolist(), strict=True)
    ]
    return lines[np.array(keep, dtype=bool)]


def _valid_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def parse_block(data: bytes) -> ParsedBlock:
    """Arrow's reading of a block of whole lines (``data`` ends with ``\\n``); the lines it leaves out are for
    the per-record road."""
    starts, ends = _line_bounds(data)
    ok, many, nesting = _candidates(data, starts, ends)
    lines = np.flatnonzero(ok)
    pieces = _read_lines(data, starts, ends, lines) if len(lines) else []
    if not pieces:
        empty = CHAT_BLOCK_SCHEMA.empty_table()
        return ParsedBlock(BlockLines(data, starts, ends), np.zeros(0, np.int64), empty, np.zeros(0, bool), {})
    read = np.concatenate([piece[0] for piece in pieces])
    table = pa.concat_tables([piece[1] for piece in pieces]) if len(pieces) > 1 else pieces[0][1]
    if not data.isascii() and not _valid_utf8(data):  # line by line only in a block holding invalid UTF-8
        valid = np.fromiter(
            (_valid_utf8(data[starts[i] : ends[i]]) for i in read.tolist()), dtype=bool, count=len(read)
        )
        if not valid.all():
            read, table = read[valid], table.filter(pa.array(valid))
    if b"text_completion" in data:
        prompted = ~_matching(data, starts, read, _NULL_PROMPT)
        if not prompted.all():
            read, table = read[prompted], table.filter(pa.array(prompted))
    marked = _matching(data, starts, read, _RECORD_KEY)
    texts = {}
    if nesting is not None:  # long records: decoded without their token lists
        for row in np.flatnonzero(marked & many[read]).tolist():
            i = int(read[row])
            if (text := nesting.without_tokens(data, int(starts[i]), int(ends[i]), i)) is not None:
                texts[row] = text
    return ParsedBlock(BlockLines(data, starts, ends), read, table, marked, texts)


def _matching(data: bytes, starts: np.ndarray, lines: np.ndarray, pattern: str) -> np.ndarray:
    """bool[len(lines)]: the lines whose text matches ``pattern`` (one pass of RE2 over the block)."""
    offsets = pa.py_buffer(np.r_[starts, len(data)].astype(np.int64))
    text = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(starts), [None, offsets, pa.py_buffer(data)])
    found = pc.match_substring_regex(text, pattern)
    return found.to_numpy(zero_copy_only=False)[lines]


__all__ = [
    "ABSENT_KEYS",
    "CHAT_BLOCK_SCHEMA",
    "MAX_DEPTH",
    "MAX_LINE_BYTES",
    "RECORD_KEYS",
    "BlockLines",
    "ParsedBlock",
    "parse_block",
]
