"""Loading a tokenizer (and optionally a chat template) for the token checks.

``PATH`` is a ``tokenizer.json``, a Hugging Face model folder (its ``tokenizer.json``, or its tiktoken vocabulary,
plus ``tokenizer_config.json`` for the special-token names and an optional ``chat_template``), or a tiktoken BPE
file (:mod:`prl.checks.tiktoken_bpe`). Encoding and decoding go through the Rust ``tokenizers`` batch calls
with no special tokens added and none skipped; chat templates are rendered only by transformers' sandboxed
Jinja renderer. Nothing is downloaded and no remote code is ever run.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from prl.checks.tiktoken_bpe import added_tokens_of, bpe_tokenizer, is_tiktoken_file, tiktoken_file_in
from prl.errors import UsageError
from prl.io.packages import resolved

END_OF_TURN_NAMES = (
    "<|EOT|>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|return|>",
)
"""Added-token contents that end a turn in common chat formats; those present in a vocabulary count as stop
tokens next to the EOS token."""


def _token_content(value: Any) -> str | None:
    """A special-token entry of ``tokenizer_config.json``: a string or an ``AddedToken`` dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


PACKAGED_TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")
"""Chat templates shipped with prl (``deepseek_v4``, ``deepseek_v4_keep_think``), usable by name."""


def read_template(chat_template: str) -> str:
    """The template text from a file path, a packaged template's name, or the argument itself when it is
    template source."""
    if os.path.isfile(chat_template):
        with open(chat_template, encoding="utf-8") as fh:
            return fh.read()
    packaged = os.path.join(PACKAGED_TEMPLATES, f"{chat_template}.jinja")
    if os.sep not in chat_template and os.path.isfile(packaged):
        with open(packaged, encoding="utf-8") as fh:
            return fh.read()
    if "{%" in chat_template or "{{" in chat_template:
        return chat_template
    raise UsageError(f"chat template file not found: {chat_template}")


@dataclass
class CheckTokenizer:
    """A loaded tokenizer with what the checks need from it.

    ``vocab_size`` counts added tokens; ``special_ids`` are added tokens flagged ``special``; ``boundary_ids``
    are added tokens that the tokenizer splits out before pre-tokenization (no lstrip/rstrip/single-word), so
    text between two of them is tokenized independently; ``stop_ids`` are EOS plus known end-of-turn tokens.
    """

    path: str
    tokenizer: Tokenizer
    tokenizer_bytes_sha256: str
    config: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    extra_stop_ids: tuple[int, ...] = ()

    # --- loading -------------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        path: str,
        chat_template: str | None = None,
        stop_token_ids: Sequence[int] = (),
        pattern: str | None = None,
    ) -> CheckTokenizer:
        """Load ``path``: a ``tokenizer.json``, a Hugging Face model folder (its ``tokenizer.json``, else its
        tiktoken vocabulary, with ``tokenizer_config.json``), or a tiktoken BPE file. ``pattern`` is a tiktoken
        vocabulary's pre-tokenizer regex (else the config's ``pat_str``); its special tokens come from the
        config's ``added_tokens_decoder`` (:mod:`prl.checks.tiktoken_bpe`). ``chat_template`` is a file or
        template source; without it the config's template is used when present.

        Either may also be ``package:NAME[/PATH]``, a file or folder inside an installed package
        (:mod:`prl.io.packages`), as a recipe names them.

        Raises :class:`UsageError` when the path or template is missing or unreadable.
        """
        path = resolved(path)
        chat_template = None if chat_template is None else resolved(chat_template)
        if not os.path.exists(path):
            raise UsageError(f"tokenizer not found: {path} (give a tokenizer.json, a model folder or a tiktoken file)")
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        config = _read_config(folder)
        tok_file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if os.path.isdir(path) and not os.path.isfile(tok_file):
            tok_file = tiktoken_file_in(path) or tok_file
        if not os.path.isfile(tok_file):
            raise UsageError(f"no tokenizer.json or tiktoken vocabulary in {path}")
        with open(tok_file, "rb") as fh:
            raw = fh.read()
        if is_tiktoken_file(tok_file):
            raw, build = _tiktoken(tok_file, raw, pattern or config.get("pat_str"), config)
        else:
            build = _from_json(tok_file, raw)
        digest = hashlib.sha256(raw).hexdigest()
        template = read_template(chat_template) if chat_template is not None else None
        if template is None:
            found = config.get("chat_template")
            if isinstance(found, list):  # named templates: take "default"
                found = next((t.get("template") for t in found if t.get("name") == "default"), None)
            template = found if isinstance(found, str) else None
        return cls(
            path=tok_file,
            tokenizer=_loaded(digest, build),
            tokenizer_bytes_sha256=digest,
            config=config,
            template=template,
            extra_stop_ids=tuple(int(i) for i in stop_token_ids),
        )

    # --- vocabulary facts ---------------------------------------------------------------------------------
    @cached_property
    def vocab_size(self) -> int:
        added = self.tokenizer.get_added_tokens_decoder()
        return max(self.tokenizer.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)

    @cached_property
    def special_ids(self) -> np.ndarray:
        """Sorted int64 IDs of added tokens flagged ``special``."""
        ids = [i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special]
        return np.array(sorted(ids), dtype=np.int64)

    @cached_property
    def boundary_lut(self) -> np.ndarray:
        """bool[vocab_size]: True for added tokens that split the text before pre-tokenization."""
        lut = np.zeros(self.vocab_size, dtype=bool)
        for i, t in self.tokenizer.get_added_tokens_decoder().items():
            if not (t.lstrip or t.rstrip or t.single_word):
                lut[i] = True
        return lut

    @cached_property
    def special_lut(self) -> np.ndarray:
        lut = np.zeros(self.vocab_size, dtype=bool)
        lut[self.special_ids] = True
        return lut

    def special_token(self, name: str) -> str | None:
        """Content of a named special token (``bos_token``, ``eos_token``) from tokenizer_config.json."""
        return _token_content(self.config.get(name))

    @cached_property
    def eos_id(self) -> int | None:
        content = self.special_token("eos_token")
        return None if content is None else self.tokenizer.token_to_id(content)

    @cached_property
    def stop_ids(self) -> np.ndarray:
        """Sorted int64 IDs that may end a completion the model stopped (EOS, end-of-turn tokens, extras)."""
        ids = set(self.extra_stop_ids)
        if self.eos_id is not None:
            ids.add(self.eos_id)
        for name in END_OF_TURN_NAMES:
            found = self.tokenizer.token_to_id(name)
            if found is not None:
                ids.add(found)
        return np.array(sorted(ids), dtype=np.int64)

    def fingerprint(self, options: dict[str, Any]) -> str:
        """sha256 over the tokenizer.json bytes, the chat template and the check options (hex, 64 chars)."""
        h = hashlib.sha256()
        h.update(self.tokenizer_bytes_sha256.encode())
        h.update(b"\0template\0")
        h.update((self.template or "").encode("utf-8"))
        h.update(b"\0options\0")
        h.update(json.dumps(options, sort_keys=True).encode())
        h.update(json.dumps(sorted(self.extra_stop_ids)).encode())
        return h.hexdigest()

    # --- batch calls ---------------------------------------------------------------------------------------
    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Decode token-ID lists to text, special tokens kept."""
        return self.tokenizer.decode_batch(list(ids), skip_special_tokens=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode texts to token-ID lists, no special tokens added."""
        encode = getattr(self.tokenizer, "encode_batch_fast", None) or self.tokenizer.encode_batch  # no offsets
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """Each token decoded alone (partial UTF-8 shows as U+FFFD), for showing a divergence."""
        known = self.piece_pairs(ids)
        return [known[int(i)][1] for i in ids]

    @cached_property
    def _pieces(self) -> dict[int, list[Any]]:
        return {}

    def piece_pairs(self, ids: Iterable[int]) -> dict[int, list[Any]]:
        """``id → [id, piece]`` (see :meth:`pieces`) holding at least ``ids``. Each ID is decoded once per
        tokenizer (at most its vocabulary in memory); the pairs are shared, not copied."""
        known = self._pieces
        missing = [int(i) for i in set(ids).difference(known)]
        if missing:
            decoded = self.tokenizer.decode_batch([[i] for i in missing], skip_special_tokens=False)
            known.update((i, [i, piece]) for i, piece in zip(missing, decoded, strict=True))
        return known

    # --- chat templates -----------------------------------------------------------------------------------
    def template_variables(self) -> dict[str, str]:
        """The special tokens a chat template may use (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``)."""
        return {
            name: content
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (content := self.special_token(name)) is not None
        }

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """Render ``messages`` with the chat template (``add_generation_prompt=True``) in transformers'
        sandboxed Jinja environment, in this process and without a budget (the ``template`` check renders in
        a :class:`~prl.checks.template_worker.TemplateWorker`). Raises ValueError without a template."""
        if self.template is None:
            raise ValueError("no chat template")
        from prl.checks.template_worker import render_chat

        return render_chat(self.template, messages, tools, self.template_variables(), self.path)


def _read_config(folder: str) -> dict[str, Any]:
    config_file = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(config_file):
        return {}
    try:
        with open(config_file, encoding="utf-8") as fh:
            config = json.load(fh)
    except ValueError as exc:
        raise UsageError(f"cannot read {config_file}: {exc}") from exc
    return config if isinstance(config, dict) else {}


LOADED_TOKENIZERS = 2
"""Tokenizers a process keeps built, by the digest of the bytes that identify them (:func:`_loaded`)."""
_LOADED: OrderedDict[str, Tokenizer] = OrderedDict()
_LOADED_LOCK = threading.Lock()


def _loaded(digest: str, build: Callable[[], Tokenizer]) -> Tokenizer:
    """The tokenizer whose identifying bytes have sha256 ``digest``: built by ``build`` the first time, then
    the same object while it is among the :data:`LOADED_TOKENIZERS` used last. Building one from a 128 k
    vocabulary costs about half a CPU second, more than a small check-tokens run; the checks only call a
    tokenizer's encode and decode (nothing changes it once built), so runs in one process can share it. A
    library user who changes a loaded :attr:`CheckTokenizer.tokenizer` (adds tokens, sets truncation) changes it
    for every load of the same bytes in the process: copy it first."""
    with _LOADED_LOCK:
        found = _LOADED.get(digest)
        if found is not None:
            _LOADED.move_to_end(digest)
            return found
    tokenizer = build()
    with _LOADED_LOCK:
        _LOADED[digest] = tokenizer
        while len(_LOADED) > LOADED_TOKENIZERS:
            _LOADED.popitem(last=False)
    return tokenizer


def _from_json(path: str, raw: bytes) -> Callable[[], Tokenizer]:
    """What builds the tokenizer of the ``tokenizer.json`` bytes ``raw`` (a :class:`UsageError` if they are
    not one)."""

    def build() -> Tokenizer:
        try:
            return Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:
            raise UsageError(f"cannot load tokenizer {path}: {exc}") from exc

    return build


def _tiktoken(path: str, raw: bytes, pattern: Any, config: dict[str, Any]) -> tuple[bytes, Callable[[], Tokenizer]]:
    """The bytes that identify the tokenizer of a tiktoken file (file, pattern and special tokens), and what
    builds it."""
    if not isinstance(pattern, str) or not pattern:
        raise UsageError(
            f"{path} is a tiktoken vocabulary: give its pre-tokenizer pattern (the model's pat_str) as pat_str "
            "in a tokenizer_config.json beside it"
        )
    specials = added_tokens_of(config)
    identity = raw + b"\0pattern\0" + pattern.encode() + b"\0specials\0" + json.dumps(specials, sort_keys=True).encode()
    return identity, lambda: bpe_tokenizer(path, pattern, specials)
