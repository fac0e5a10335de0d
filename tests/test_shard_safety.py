"""The suite-wide safe-values scan finds what it must (its own test: a scan that never fails proves nothing)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from prl.schema import SHARD
from tests.shard_safety import unsafe_shards
from tests.test_loaders import shard_row


def test_the_scan_names_each_unsafe_value(tmp_path):
    kl = {"ref_logprobs": [-1.0, -1.0], "kl": [0.0, 0.0]}
    rows = [
        shard_row("a", "g", [1], [5, 6], behavior_logprobs=[None, -1.0], **kl),
        shard_row("b", "g", [1], [5, 6], token_advantages=[1.0, float("nan")], **kl),
        shard_row("c", "g", [1], [5, 6], behavior_logprobs=[None, None], loss_mask=[False, False], **kl),  # fine
        shard_row("d", "g", [1], [5], kl=[float("inf")], ref_logprobs=[-1.0]),
        shard_row("e", "g", [1], [5], kl=None, ref_logprobs=None),  # no reference in a set with them
    ]
    folder = tmp_path / "set"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD), folder / "part-00000.parquet")
    (folder / "part-00001.parquet").write_bytes(b"PAR1 damaged on purpose")
    try:
        problems = unsafe_shards(tmp_path)
    finally:
        (folder / "part-00000.parquet").unlink()  # the session's own scan must not trip on this test's file
    assert [p.split(": ", 1)[1] for p in problems] == [
        "behavior_logprobs of a at 0 is None inside loss_mask",
        "ref_logprobs of e at 0 is None inside loss_mask",
        "kl of d at 0 is inf inside loss_mask",
        "kl of e at 0 is None inside loss_mask",
        "token_advantages of b at 1 is nan inside loss_mask",
    ]
