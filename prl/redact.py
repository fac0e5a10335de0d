"""Credentials never kept, never printed: one helper, :func:`redact`, for every text prl stores or shows that may
hold one (error messages, JSON summaries, log lines at every verbosity, quarantined raw lines).

What it replaces with ``***``:

- the userinfo of every URL (``http://key:secret@host`` → ``http://***@host``); a password may hold raw ``/`` (an
  unescaped AWS secret);
- the value of every credential header or key (:data:`CREDENTIAL_NAMES`, any case, ``-`` or ``_``) in JSON text,
  at any depth of JSON held in JSON strings (a proxy capture's ``"request": "{\\"headers\\": …}"``), as an object
  member (``"Authorization": "Bearer …"``) or a ``[name, value]`` pair, also when the line was cut short inside the
  value; and in header lines (``Authorization: Bearer …``, up to the end of the line or a quote);
- the values of the secrets the environment holds (:data:`SECRET_ENV`, and the user and password of
  ``AWS_ENDPOINT_URL[_S3]``), wherever they appear: some libraries print a URL's user as a host name.

A redacted text keeps everything else as it was (a JSON string that held a credential is written again in
JSON's own escaping, the rest byte for byte), so a quarantined line still shows what was wrong with it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from urllib.parse import unquote, urlsplit

MASK = "***"
CREDENTIAL_NAMES = (
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "apikey",
    "x-auth-token",
    "auth-token",
    "cookie",
    "set-cookie",
    "x-amz-security-token",
    "x-goog-api-key",
    "ocp-apim-subscription-key",
)
"""Header (or JSON key) names whose value is a credential; ``_`` reads as ``-``."""
SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "PRL_REF_API_KEY",
    "OPENAI_API_KEY",
    "TINKER_API_KEY",
)
"""Environment variables holding secrets prl may hand to a library whose messages could repeat them."""
ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
MIN_SECRET_CHARS = 4
"""Shorter values from the environment are not searched for (a user ``a`` would mask every ``a``)."""
MAX_DEPTH = 6
"""JSON strings inside JSON strings followed this deep."""

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@:\"']+(?::[^\s@\"']*)?@")
_NAMES = "|".join(re.escape(name).replace("\\-", "[-_]") for name in CREDENTIAL_NAMES)
_MENTION = re.compile(f"(?i)(?:{_NAMES})")
_LITERAL = re.compile(r'"(?:[^"\\]|\\.|\\$)*(?:"|$)', re.S)
_AFTER_KEY = re.compile(r"\s*:\s*")
_PAIR_OPEN = re.compile(r"\[\s*$")
_PAIR_SEP = re.compile(r"\s*,\s*")
_HEADER_LINE = re.compile(rf"(?i)(?<![\w\"\\-])((?:{_NAMES})[ \t]*:[ \t]*)(?![ \t]*[\"\\\[{{])[^\r\n\"']+")
_PARTIAL_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?$")


def redact_urls(text: str) -> str:
    """``text`` with the userinfo of every ``scheme://user:password@host`` URL replaced by ``***``."""
    return _USERINFO.sub(r"\1***@", text)


def redact(text: str) -> str:
    """``text`` with every credential this module knows of replaced by ``***`` (see the module docstring)."""
    if _MENTION.search(text):
        text = _redact_json(text, 0)
        text = _HEADER_LINE.sub(lambda m: m.group(1) + MASK, text)
    text = redact_urls(text)
    for secret in environment_secrets():
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def environment_secrets() -> list[str]:
    """The secret values of the environment (:data:`SECRET_ENV`, the userinfo of :data:`ENDPOINT_ENV`), longest
    first, each at least :data:`MIN_SECRET_CHARS` long."""
    found = {os.environ.get(name, "") for name in SECRET_ENV}
    for name in ENDPOINT_ENV:
        value = os.environ.get(name, "")
        if "@" in value:
            try:
                parts = urlsplit(value)
            except ValueError:
                continue
            for piece in (parts.username, parts.password):
                if piece:
                    found |= {piece, unquote(piece)}
    return sorted((s for s in found if len(s) >= MIN_SECRET_CHARS), key=len, reverse=True)


def _is_credential(name: str) -> bool:
    return name.strip().lower().replace("_", "-") in CREDENTIAL_NAMES


def _decode(literal: str) -> str | None:
    """The text of one JSON string literal (quotes included; an unterminated one, cut short, as far as it goes)."""
    body = literal[1:-1] if len(literal) > 1 and literal.endswith('"') and not _escaped_end(literal) else literal[1:]
    for candidate in (body, _PARTIAL_ESCAPE.sub("", body)):
        try:
            value = json.loads(f'"{candidate}"')
        except ValueError:
            continue
        return value if isinstance(value, str) else None
    return None


def _escaped_end(literal: str) -> bool:
    """Whether the closing ``"`` of ``literal`` is itself escaped (a literal cut short after a backslash)."""
    run = len(literal) - 1 - len(literal[:-1].rstrip("\\"))
    return run % 2 == 1


def _redact_json(text: str, depth: int) -> str:
    """Credential values in the JSON text ``text`` (whole or cut short), JSON held in its strings included."""
    out: list[str] = []
    last = 0
    mask_next = False
    for match in _LITERAL.finditer(text):
        start, end = match.span()
        literal = match.group()
        if mask_next:
            out += [text[last:start], f'"{MASK}"']
            last, mask_next = end, False
            continue
        if not _MENTION.search(literal):
            continue
        name = _decode(literal)
        if name is not None and _is_credential(name):
            key = _AFTER_KEY.match(text, end)
            pair = _PAIR_OPEN.search(text, 0, start) and _PAIR_SEP.match(text, end)
            follows = key.end() if key else pair.end() if pair else -1  # a member's value, a pair's second
            mask_next = follows == len(text) or (follows >= 0 and text.startswith('"', follows))
            continue
        out += [text[last:start], _redact_literal(literal, name, depth)]
        last = end
    out.append(text[last:])
    return "".join(out)


def _redact_literal(literal: str, decoded: str | None, depth: int) -> str:
    """A JSON string literal that mentions a credential name: its text redacted (JSON or header lines inside)
    and written again as a literal; one that cannot be read is cut at the first mention."""
    if decoded is None or depth >= MAX_DEPTH:
        mention = _MENTION.search(literal)
        assert mention is not None
        return literal[: mention.end()] + f'{MASK}"'
    inner = _HEADER_LINE.sub(lambda m: m.group(1) + MASK, _redact_json(decoded, depth + 1))
    if inner == decoded:
        return literal
    closed = literal.endswith('"') and len(literal) > 1 and not _escaped_end(literal)
    encoded = json.dumps(inner, ensure_ascii=False)
    return encoded if closed else encoded[:-1]


class RedactingFormatter(logging.Formatter):
    """A log formatter whose every line (message, arguments, traceback) goes through :func:`redact`."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def redact_logging(root: logging.Logger | None = None) -> None:
    """Give every handler of ``root`` (the root logger by default) a :class:`RedactingFormatter` with the format
    it had, and route :mod:`warnings` through logging so they are redacted too."""
    logger = root or logging.getLogger()
    for handler in logger.handlers:
        current = handler.formatter
        fmt = current._fmt if current is not None else None
        datefmt = current.datefmt if current is not None else None
        handler.setFormatter(RedactingFormatter(fmt, datefmt))
    logging.captureWarnings(True)


__all__ = ["CREDENTIAL_NAMES", "MASK", "RedactingFormatter", "redact", "redact_logging", "redact_urls"]
