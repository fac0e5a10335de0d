"""The local transformers backend of ``prl score-ref``: equal to a direct forward pass, packing, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.errors import UsageError
from prl.score.base import ScoreRequest
from prl.score.local import LocalBackend, pack
from tests.score_helpers import VOCAB, Reference, build_tiny_model

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return folder, Reference(folder)


def _requests(n: int, seed: int = 0) -> list[ScoreRequest]:
    rng = np.random.default_rng(seed)
    return [
        ScoreRequest(
            f"s{i}",
            rng.integers(0, VOCAB, int(rng.integers(1, 30))).astype(np.int32),
            rng.integers(0, VOCAB, int(rng.integers(0, 20))).astype(np.int32),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("batch_tokens", [50, 4096])
def test_local_equals_direct_forward_pass(tiny, batch_tokens):
    folder, ref = tiny
    requests = _requests(24)
    backend = LocalBackend(str(folder), batch_tokens=batch_tokens)
    outcomes = backend.score(requests)
    for request, got in zip(requests, outcomes, strict=True):
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        assert got.shape == (len(request.completion_ids),)
        if len(request.completion_ids):
            want = ref.completion(request.prompt_ids.tolist(), request.completion_ids.tolist())
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
            assert (got <= 0).all()


def test_refusals_are_quarantined_with_reasons(tiny):
    folder, _ = tiny
    backend = LocalBackend(str(folder), batch_tokens=40)
    ids = np.array([5, 6], np.int32)
    cases = {
        "empty_prompt": ScoreRequest("a", np.zeros(0, np.int32), ids),
        "token_out_of_vocab": ScoreRequest("b", ids, np.array([VOCAB], np.int32)),
        "exceeds_batch_tokens": ScoreRequest("c", np.arange(2, 45, dtype=np.int32), ids),
        "too_long": ScoreRequest("d", np.full(300, 3, np.int32), ids),
    }
    good = ScoreRequest("e", ids, ids)
    outcomes = backend.score([*cases.values(), good])
    assert [getattr(o, "reason", None) for o in outcomes[:-1]] == list(cases)
    assert isinstance(outcomes[-1], np.ndarray) and outcomes[-1].shape == (2,)


def test_model_folder_must_be_local(tmp_path):
    with pytest.raises(UsageError, match="local transformers model folder"):
        LocalBackend("some-org/some-model")
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(UsageError, match="cannot load it"):
        LocalBackend(str(tmp_path))


def test_pack_examples():
    assert pack([5, 10, 3, 7], 20) == [[1, 3], [0, 2]]
    assert pack([30, 1], 20) == [[0], [1]]  # a long one alone; the caller refuses it
    assert pack([4, 4, 4], 12, completions=[3, 1, 1], max_positions=4) == [[0], [1, 2]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(0, 30)), max_size=40),
    st.integers(1, 200),
    st.integers(0, 90),
)
def test_pack_covers_every_request_once_within_bounds(items, budget, max_positions):
    lengths = [t for t, _ in items]
    completions = [min(c, t) for t, c in items]
    groups = pack(lengths, budget, completions, max_positions)
    assert sorted(i for g in groups for i in g) == list(range(len(items)))
    for group in groups:
        if len(group) > 1:
            assert len(group) * max(lengths[i] for i in group) <= budget
            if max_positions:
                assert len(group) * max(completions[i] for i in group) <= max_positions
