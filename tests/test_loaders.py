"""prl.loaders: shard rows as numpy, padded and packed batches, and the rank-sharded, resumable loader."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.errors import UsageError
from prl.loaders import Rows, ShardLoader, pack, pad
from prl.loaders.rows import pad_ragged
from prl.schema import SHARD
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from tests.shards_fixtures import random_store


def shard_row(sample_id: str, group_id: str, prompt: list[int], completion: list[int], **extra) -> dict:
    """One row in the shard schema; defaults: all tokens in the loss, logprobs −0.5, advantage 1.0."""
    n = len(completion)
    row = {
        "sample_id": sample_id,
        "group_id": group_id,
        "policy_version": "step-3",
        "staleness": 0,
        "input_ids": prompt + completion,
        "prompt_len": len(prompt),
        "loss_mask": [True] * n,
        "behavior_logprobs": [-0.5] * n,
        "ref_logprobs": None,
        "kl": None,
        "token_advantages": [1.0] * n,
        "reward": 1.0,
        "advantage": 1.0,
        "group_size": 2,
        "topk_ids": None,
        "topk_logprobs": None,
    }
    row.update(extra)
    return row


def two_rows() -> Rows:
    return Rows.from_arrow(
        pa.Table.from_pylist(
            [
                shard_row("a", "g", [1, 2], [10, 11, 12], loss_mask=[True, False, True]),
                shard_row(
                    "b",
                    "g",
                    [3],
                    [20, 21],
                    behavior_logprobs=[None, -0.25],
                    token_advantages=[-1.0, -1.0],
                    reward=0.0,
                    advantage=-1.0,
                ),
            ],
            schema=SHARD,
        )
    )


def test_rows_from_arrow_exact_and_unsafe_positions_leave_the_mask():
    rows = two_rows()
    assert rows.num_rows == 2
    assert rows.input_ids_T.tolist() == [1, 2, 10, 11, 12, 3, 20, 21]
    assert rows.seq_off_N1.tolist() == [0, 5, 8] and rows.comp_off_N1.tolist() == [0, 3, 5]
    assert rows.prompt_len_N.tolist() == [2, 1]
    # b's first completion token has no behaviour logprob: it leaves the loss mask, its value is 0.0
    assert rows.loss_mask_C.tolist() == [True, False, True, False, True]
    assert rows.unsafe_positions == 1
    assert rows.behavior_logprobs_C.tolist() == [-0.5, -0.5, -0.5, 0.0, -0.25]
    assert rows.token_advantages_C.tolist() == [1.0, 1.0, 1.0, -1.0, -1.0]
    assert rows.ref_logprobs_C is None and rows.kl_C is None
    assert rows.sample_id_N.tolist() == ["a", "b"] and rows.group_id_N.tolist() == ["g", "g"]


def test_non_finite_values_and_short_reference_rows_are_unsafe():
    table = pa.Table.from_pylist(
        [
            shard_row("a", "g", [1], [5, 6], ref_logprobs=[-0.1, float("nan")], token_advantages=[float("inf"), 1.0]),
            shard_row("b", "g", [1], [7, 8], ref_logprobs=[-0.1]),  # not as long as the completion
        ],
        schema=SHARD,
    )
    rows = Rows.from_arrow(table)
    assert rows.loss_mask_C.tolist() == [False, False, False, False]
    assert rows.unsafe_positions == 4
    assert rows.ref_logprobs_C.tolist() == [pytest.approx(-0.1), 0.0, 0.0, 0.0]
    assert rows.token_advantages_C.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert all(math.isfinite(v) for v in rows.token_advantages_C.tolist())


def test_pad_is_sequence_aligned():
    batch = pad(two_rows(), pad_id=-1)
    assert batch.input_ids_BL.tolist() == [[1, 2, 10, 11, 12], [3, 20, 21, -1, -1]]
    assert batch.attention_mask_BL.tolist() == [[True] * 5, [True, True, True, False, False]]
    assert batch.position_ids_BL.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]]
    assert batch.loss_mask_BL.tolist() == [[False, False, True, False, True], [False, False, True, False, False]]
    assert batch.behavior_logprobs_BL.tolist() == [[0, 0, -0.5, -0.5, -0.5], [0, 0.0, -0.25, 0, 0]]
    assert batch.token_advantages_BL.tolist() == [[0, 0, 1, 1, 1], [0, -1, -1, 0, 0]]
    assert batch.ref_logprobs_BL is None and batch.kl_BL is None
    assert pad(two_rows(), length=7).input_ids_BL.shape == (2, 7)
    with pytest.raises(ValueError, match="does not fit"):
        pad(two_rows(), length=4)


def test_pack_restarts_positions_per_row():
    batch = pack(two_rows())
    assert batch.input_ids_T.tolist() == [1, 2, 10, 11, 12, 3, 20, 21]
    assert batch.position_ids_T.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert batch.cu_seqlens_B1.tolist() == [0, 5, 8] and batch.cu_seqlens_B1.dtype == np.int32
    assert batch.loss_mask_T.tolist() == [False, False, True, False, True, False, False, True]
    assert batch.behavior_logprobs_T.tolist() == [0, 0, -0.5, -0.5, -0.5, 0, 0, -0.25]


def test_pad_ragged_left():
    values = np.array([1, 2, 3, 4, 5])
    assert pad_ragged(values, np.array([0, 3, 5]), 4, 0, left=True).tolist() == [[0, 1, 2, 3], [0, 0, 4, 5]]
    assert pad_ragged(values, np.array([0, 0, 5])).tolist() == [[0, 0, 0, 0, 0], [1, 2, 3, 4, 5]]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A set of 40 groups of 3 samples in several parts."""
    root = tmp_path_factory.mktemp("loaders")
    store = random_store(str(root / "store"), n_groups=40, group_size=3, seed=1)
    res = build_shards(store, str(root / "out"), options=ShardOptions(target_tokens=300))
    assert res.status == "built" and res.rows == 120 and len(res.shards) > 2
    return res


def ids_of(loader) -> list[list[str]]:
    return [batch.sample_id_N.tolist() for batch in loader]


def test_every_row_once_across_ranks_with_groups_whole(built):
    seen: dict[str, int] = {}
    for rank in range(3):
        loader = ShardLoader(built.out, batch_rows=10, rank=rank, world_size=3, layout="rows", drop_uneven=False)
        for batch in ids_of(loader):
            for sid in batch:
                assert sid not in seen
                seen[sid] = rank
    assert len(seen) == 120
    # a group (r<g>-<i>) lives on one rank
    ranks_of_group: dict[str, set[int]] = {}
    for sid, rank in seen.items():
        ranks_of_group.setdefault(sid.split("-")[0], set()).add(rank)
    assert all(len(r) == 1 for r in ranks_of_group.values()) and len(ranks_of_group) == 40


def test_batches_hold_whole_groups_of_about_the_budget(built):
    loader = ShardLoader(built.set_dir, batch_rows=10, layout="rows")
    batches = ids_of(loader)
    assert sum(len(b) for b in batches) == 120
    for batch in batches:
        groups = [sid.split("-")[0] for sid in batch]
        assert all(groups.count(g) == 3 for g in groups)  # whole groups only
        assert len(batch) <= 12
    tokens = ShardLoader(built.set_dir, batch_tokens=100, layout="padded")
    for batch in tokens:
        assert int(batch.attention_mask_BL.sum()) <= 100 + max(batch.rows.seq_len_N) * 3


def test_epoch_shuffle_is_deterministic_and_changes_by_epoch(built):
    a = ShardLoader(built.out, batch_rows=9, layout="rows", seed=5)
    b = ShardLoader(built.out, batch_rows=9, layout="rows", seed=5)
    first_a, first_b = ids_of(a), ids_of(b)
    assert first_a == first_b
    second = ids_of(a)  # the next epoch
    assert a.epoch == 2 and second != first_a
    assert sorted(s for b in second for s in b) == sorted(s for b in first_a for s in b)
    unshuffled = ShardLoader(built.out, batch_rows=9, layout="rows", shuffle=False)
    assert ids_of(unshuffled) == ids_of(unshuffled)  # same order every epoch


def test_resume_from_state_dict(built):
    loader = ShardLoader(built.out, batch_rows=8, layout="packed", world_size=2, rank=1, seed=3)
    full = [b.rows.sample_id_N.tolist() for b in ShardLoader(built.out, batch_rows=8, world_size=2, rank=1, seed=3)]
    taken = []
    for i, batch in enumerate(loader):
        taken.append(batch.rows.sample_id_N.tolist())
        if i == 1:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["next_batch"] == 2 and state["epoch"] == 0
    resumed = ShardLoader(built.out, batch_rows=8, layout="packed", world_size=2, rank=1, seed=3)
    resumed.load_state_dict(state)
    rest = [b.rows.sample_id_N.tolist() for b in resumed]
    assert taken + rest == full
    assert resumed.epoch == 1 and resumed.state_dict()["next_batch"] == 0


def test_drop_uneven_gives_every_rank_the_same_batch_count(built):
    counts = [len(ShardLoader(built.out, batch_rows=7, rank=r, world_size=4)) for r in range(4)]
    assert len(set(counts)) == 1
    loaders = [ShardLoader(built.out, batch_rows=7, rank=r, world_size=4, layout="rows") for r in range(4)]
    rows = sum(len(b) for loader in loaders for b in ids_of(loader))
    assert rows + sum(loader.dropped_rows for loader in loaders) == 120


def test_bad_arguments_are_usage_errors(built, tmp_path):
    with pytest.raises(UsageError, match="exactly one"):
        ShardLoader(built.out, batch_rows=4, batch_tokens=10)
    with pytest.raises(UsageError, match="exactly one"):
        ShardLoader(built.out)
    with pytest.raises(UsageError, match="at least one"):
        ShardLoader(built.out, batch_rows=0)
    with pytest.raises(UsageError, match="rank 2"):
        ShardLoader(built.out, batch_rows=4, rank=2, world_size=2)
    with pytest.raises(UsageError, match="layout"):
        ShardLoader(built.out, batch_rows=4, layout="ragged")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not a shard set"):
        ShardLoader(str(tmp_path / "missing"), batch_rows=4)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no shard set"):
        ShardLoader(str(tmp_path / "empty"), batch_rows=4)
    loader = ShardLoader(built.out, batch_rows=4, seed=1)
    state = loader.state_dict()
    with pytest.raises(UsageError, match="cannot resume: seed"):
        ShardLoader(built.out, batch_rows=4, seed=2).load_state_dict(state)
    with pytest.raises(UsageError, match="cannot resume: sets"):
        ShardLoader(built.out, batch_rows=4, seed=1).load_state_dict({**state, "sets": ["other"]})


def test_shards_list_library_and_cli(built, tmp_path):
    from typer.testing import CliRunner

    from prl.cli import app
    from prl.shards.listing import list_sets

    listing = list_sets(built.out)
    parts = [os.path.join(built.set_dir, s["file"]) for s in built.shards]
    assert listing.files == parts and [s.set_id for s in listing.sets] == [built.set_id]
    assert listing.sets[0].rows == 120
    assert list_sets(built.set_dir).files == parts
    runner = CliRunner()
    result = runner.invoke(app, ["shards", "list", built.out])
    assert result.exit_code == 0 and result.output.splitlines() == parts
    as_json = json.loads(runner.invoke(app, ["shards", "list", built.out, "--json"]).output)
    assert as_json["files"] == parts and as_json["rows"] == 120 and as_json["exit_code"] == 0
    missing = runner.invoke(app, ["shards", "list", str(tmp_path / "nope")])
    assert missing.exit_code == 2


def rows_equal(a: Rows, b: Rows) -> None:
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
        elif isinstance(x, int):
            assert x == y, name
        else:
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name


def test_take_gathers_rows_by_offsets_exactly_as_arrow_take():
    table = pa.Table.from_pylist(
        [
            shard_row("a", "g", [1, 2], [10, 11, 12], loss_mask=[True, False, True], ref_logprobs=[-1.0, -2.0, -3.0]),
            shard_row("b", "g", [3], [20, 21], behavior_logprobs=[None, -0.25], ref_logprobs=[-1.0, -1.5]),
            shard_row("c", "h", [], [30], ref_logprobs=[float("nan")], temperature=0.5),
            shard_row("d", "h", [4, 5, 6], [], ref_logprobs=[]),
        ],
        schema=SHARD,
    )
    rows = Rows.from_arrow(table)
    assert rows.unsafe_N.tolist() == [0, 1, 1, 0] and rows.unsafe_positions == 2
    assert rows.take(np.zeros(0, np.int64)).num_rows == 0
    for idx in ([2, 0], [3, 1, 1], [0, 1, 2, 3]):
        got = rows.take(np.array(idx, dtype=np.int64))
        rows_equal(got, Rows.from_arrow(table.take(pa.array(idx, pa.int64()))))
    assert rows.take(np.array([1, 2])).unsafe_positions == 2


def test_concat_fills_values_a_part_lacks_as_absent():
    with_ref = Rows.from_arrow(
        pa.Table.from_pylist([shard_row("a", "g", [1], [10, 11], ref_logprobs=[-1.0, -2.0])], schema=SHARD)
    )
    without = Rows.from_arrow(pa.Table.from_pylist([shard_row("b", "g", [2], [20])], schema=SHARD))
    both = Rows.concat([with_ref, without])
    table = pa.concat_tables(
        [
            pa.Table.from_pylist([shard_row("a", "g", [1], [10, 11], ref_logprobs=[-1.0, -2.0])], schema=SHARD),
            pa.Table.from_pylist([shard_row("b", "g", [2], [20])], schema=SHARD),
        ]
    )
    rows_equal(both, Rows.from_arrow(table))  # what reading the parts as one table gives
    assert both.loss_mask_C.tolist() == [True, True, False] and both.unsafe_positions == 1
    assert both.ref_logprobs_C.tolist() == [-1.0, -2.0, 0.0] and both.unsafe_N.tolist() == [0, 1]


def reference_plan(loader: ShardLoader, epoch: int) -> list[list[str]]:
    """The epoch plan as the module docstring states it, group by group in Python, as sample ids per batch."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng((loader.seed, epoch))
    parts = loader._parts
    order = rng.permutation(len(parts)) if loader.shuffle else np.arange(len(parts))
    groups = []
    for p in order.tolist():
        ids = pq.read_table(parts[p].path, columns=["sample_id", "group_id"]).to_pylist()
        members: dict[str, list[str]] = {}
        for r in ids:
            members.setdefault(r["group_id"], []).append(r["sample_id"])
        listed = list(members.values())
        g_order = rng.permutation(len(listed)) if loader.shuffle else np.arange(len(listed))
        groups.extend(listed[g] for g in g_order.tolist())
    per_rank = []
    for rank in range(loader.world_size):
        batches: dict[int, list[str]] = {}
        start = 0
        for g in groups[rank :: loader.world_size]:
            batches.setdefault(start // loader.batch_rows, []).extend(g)
            start += len(g)
        per_rank.append(list(batches.values()))
    keep = min(len(b) for b in per_rank) if loader.drop_uneven else len(per_rank[loader.rank])
    return per_rank[loader.rank][:keep]


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_rows=10),
        dict(batch_rows=7, world_size=3, rank=1, seed=4),
        dict(batch_rows=9, world_size=2, rank=1, shuffle=False, drop_uneven=False),
        dict(batch_rows=50, world_size=4, rank=3, seed=2),
    ],
)
def test_batches_are_the_documented_plan(built, kw):
    loader = ShardLoader(built.out, layout="rows", **kw)
    for epoch in range(2):
        assert ids_of(loader) == reference_plan(loader, epoch)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),
            st.lists(st.sampled_from([-0.5, -1.25, None, float("nan")]), max_size=5),
            st.booleans(),
            st.sampled_from([0.5, None]),
        ),
        min_size=1,
        max_size=6,
    ),
    st.data(),
)
def test_take_and_concat_are_arrow_take_and_concat(spec, data):
    """Rows.take / Rows.concat give exactly what decoding arrow's take / concatenation of the rows gives (rows
    without reference logprobs in a set that has them: positions out of the mask, counted unsafe)."""
    rows = []
    for i, (prompt, lps, with_ref, temp) in enumerate(spec):
        n = len(lps)
        rows.append(
            shard_row(
                f"s{i}",
                f"g{i % 2}",
                list(range(prompt)),
                list(range(100, 100 + n)),
                behavior_logprobs=lps,
                ref_logprobs=[-0.25] * n if with_ref or i == 0 else None,
                temperature=temp,
            )
        )
    table = pa.Table.from_pylist(rows, schema=SHARD)
    decoded = Rows.from_arrow(table)
    # row 0 has reference logprobs: decoding arrow's take then sees the column as the part does (taking only rows
    # without them would decode as a set without reference logprobs)
    idx = [0, *data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=8))]
    rows_equal(decoded.take(np.array(idx)), Rows.from_arrow(table.take(pa.array(idx, pa.int64()))))
    cut = data.draw(st.integers(1, len(rows)))
    if cut < len(rows):
        head, tail = table.slice(0, cut), table.slice(cut)
        rows_equal(Rows.concat([Rows.from_arrow(head), Rows.from_arrow(tail)]), decoded)
