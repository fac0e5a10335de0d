"""Columnar validation and assembly agree with the per-sample validator on every row."""

from __future__ import annotations

import math

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.formats.base import Quarantined, Sample
from prl.ingestion.assemble import Located, prompt_digest, record_digest, validate
from prl.ingestion.batch import check_and_assemble

IDS = st.lists(st.sampled_from([0, 1, 7, 2**31 - 1, 2**31, -1, 128000]), max_size=5)
LOGPROBS = st.lists(
    st.sampled_from([None, -0.5, 0.0, -9999.0, -20000.0, 0.25, math.nan, math.inf, -math.inf, -1.25]), max_size=5
)


@st.composite
def samples(draw: st.DrawFn) -> Sample:
    completion = draw(IDS)
    n = len(completion)
    lps = draw(st.one_of(LOGPROBS, st.just([-1.0] * n)))
    sample = Sample(
        request_id=draw(st.sampled_from(["a", "b", "c"])),
        choice_index=draw(st.integers(0, 2)),
        prompt_token_ids=pa.array(draw(IDS), pa.int64()),
        completion_token_ids=pa.array(completion, pa.int64()),
        completion_logprobs=pa.array(lps, pa.float64()),
        finish_reason=draw(st.sampled_from(["stop", "length", None])),
        group_key=draw(st.sampled_from([None, "g"])),
    )
    if draw(st.booleans()):
        sample.completion_mask = pa.array(draw(st.lists(st.booleans(), min_size=n, max_size=n + 1)))
    heads = draw(st.sampled_from(["none", "ok", "ids_only", "ragged", "bad_id", "short"]))
    rows = n - 1 if heads == "short" else n
    if heads != "none":
        ids = [[3, 2] for _ in range(rows)]
        lp = [[-0.5, -9999.0 if i % 2 else -1.5] for i in range(rows)]
        if heads == "ragged" and rows:
            lp[0] = [-0.5]
        if heads == "bad_id" and rows:
            ids[-1] = [2**31, 1]
        sample.topk_ids = pa.array(ids, pa.list_(pa.int64()))
        sample.topk_logprobs = None if heads == "ids_only" else pa.array(lp, pa.list_(pa.float64()))
    return sample


def _copy(sample: Sample) -> Sample:
    fields = {name: getattr(sample, name) for name in Sample.__dataclass_fields__}
    return Sample(**fields)


@settings(max_examples=150, deadline=None)
@given(st.lists(samples(), min_size=1, max_size=8))
def test_batch_agrees_with_the_per_sample_validator(batch: list[Sample]) -> None:
    expected_rejects: dict[int, str] = {}
    expected_good: list[Sample] = []
    for i, sample in enumerate(batch):
        try:
            expected_good.append(validate(_copy(sample)))
        except Quarantined as q:
            expected_rejects[i] = q.reason
    checked = check_and_assemble([Located(s, "u", i + 1, "f") for i, s in enumerate(batch)], 5)
    assert {i: q.reason for i, q in checked.rejected} == expected_rejects
    assert checked.rows.tolist() == [i for i in range(len(batch)) if i not in expected_rejects]
    out = checked.batch.to_pylist()
    assert len(out) == len(expected_good)
    for row, sample in zip(out, expected_good, strict=True):
        assert row["record_digest"] == record_digest(sample)
        assert row["group_id"] == (sample.group_key or prompt_digest(sample.prompt_token_ids))
        assert row["prompt_token_ids"] == sample.prompt_token_ids.to_pylist()
        assert row["completion_token_ids"] == sample.completion_token_ids.to_pylist()
        assert row["completion_logprobs"] == sample.completion_logprobs.cast(pa.float32()).to_pylist()
        mask = sample.completion_mask
        assert row["completion_mask"] == (None if mask is None else mask.to_pylist())
        ids, lps = sample.topk_ids, sample.topk_logprobs
        assert row["topk_ids"] == (None if ids is None else ids.to_pylist())
        assert row["topk_logprobs"] == (None if lps is None else lps.cast(pa.list_(pa.float32())).to_pylist())
        assert row["source_uri"] == "u" and row["ingested_at"].timestamp() == 0.005


def test_mixed_integer_widths_from_different_readers_are_one_column() -> None:
    def sample(rid: str, ids_type: pa.DataType) -> Located:
        s = Sample(rid, 0, pa.array([1, 2], ids_type), pa.array([3], ids_type), pa.array([-0.5]), "stop")
        return Located(s, "u", 1, "f")

    checked = check_and_assemble([sample("a", pa.int64()), sample("b", pa.int32())], 0)
    assert checked.rejected == []
    assert checked.batch.column("prompt_token_ids").to_pylist() == [[1, 2], [1, 2]]
