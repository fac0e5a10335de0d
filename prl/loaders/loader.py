"""Iterate shard sets as training batches: sharded by rank with groups whole, shuffled per epoch, resumable.

``ShardLoader(path)`` reads one set folder or every current set of an ``OUT`` folder
(:func:`prl.shards.layout.resolve`). Planning reads only the small columns (``group_id``, and ``prompt_len`` +
``loss_mask`` lengths when batches are sized in tokens). Reading is by part: when a batch first needs a part, the
part is read once and the rows this rank reads from it in the epoch are decoded into numpy (:class:`Rows`); each
batch is then gathered from the decoded parts by offsets (:meth:`Rows.take`), whole groups at a time, with no
per-row or per-group work in Python. The last two parts stay decoded, which is all a batch needs when batches are
smaller than parts.

The epoch plan, identical on every rank (it depends only on the sets, ``seed`` and the epoch):

1. The groups of the sets: rows sharing a ``group_id`` within one part (a build keeps a group within one part).
2. With ``shuffle``, the parts are permuted, and the groups within each part, by ``numpy.random.default_rng((seed,
   epoch))``; so a rank reads each part once per epoch. Without, groups keep the sets' order.
3. The groups are dealt to ranks in turn (group ``g`` to rank ``g mod world_size``): each group goes to exactly
   one rank, whole.
4. Each rank cuts its groups into batches: a group belongs to the batch in whose window of ``batch_rows`` rows
   (or ``batch_tokens`` tokens) its first row falls, so batches hold about that many rows and groups are never
   split. With ``drop_uneven`` (the default) every rank yields as many batches as the rank with the fewest, so
   collective operations line up; the groups left over are counted in :attr:`ShardLoader.dropped_rows`.

The position (epoch, next batch) is :meth:`ShardLoader.state_dict`; :meth:`ShardLoader.load_state_dict` resumes
there without reading the batches already seen.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prl.errors import UsageError
from prl.loaders.rows import ROW_COLUMNS, PackedBatch, PaddedBatch, Rows, pack, pad
from prl.shards.layout import resolve
from prl.shards.manifest import Manifest

Layout = Literal["padded", "packed", "rows"]
Batch = PaddedBatch | PackedBatch | Rows


@dataclass
class _Part:
    path: str
    set_id: str
    group_N: np.ndarray
    """Group number of each row within the part (0-based, in order of first appearance)."""
    tokens_N: np.ndarray


def _plan_part(path: str, set_id: str, with_tokens: bool) -> _Part:
    columns = ["group_id", "prompt_len", "loss_mask"] if with_tokens else ["group_id"]
    table = pq.read_table(path, columns=columns)
    group = table["group_id"].combine_chunks().dictionary_encode()
    group_N = np.asarray(group.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    tokens_N = np.ones(table.num_rows, dtype=np.int64)
    if with_tokens:
        import pyarrow.compute as pc

        comp = pc.fill_null(pc.list_value_length(table["loss_mask"]), 0)
        tokens_N = np.asarray(pc.add(table["prompt_len"].cast(pa.int64()), comp.cast(pa.int64())).to_numpy())
    return _Part(path, set_id, group_N, tokens_N)


@dataclass
class _Groups:
    """Every group of the sets, as arrays: group ``g`` is the rows ``row_R[off_G1[g]:off_G1[g + 1]]`` (global row
    numbers: part ``p``'s rows start at ``part_row0_P1[p]``), groups numbered part after part, each part's in order
    of first appearance; ``part_group0_P1`` bounds each part's groups."""

    row_R: np.ndarray
    off_G1: np.ndarray
    part_group0_P1: np.ndarray
    part_row0_P1: np.ndarray
    rows_G: np.ndarray
    tokens_G: np.ndarray

    @classmethod
    def of(cls, parts: list[_Part]) -> _Groups:
        rows, sizes, tokens, groups_P, rows_P = [], [], [], [0], [0]
        for part in parts:
            order = np.argsort(part.group_N, kind="stable")
            n_groups = int(part.group_N.max(initial=-1)) + 1
            size = np.bincount(part.group_N, minlength=n_groups).astype(np.int64)
            rows.append(order + rows_P[-1])
            sizes.append(size)
            tokens.append(np.bincount(part.group_N, weights=part.tokens_N, minlength=n_groups).astype(np.int64))
            groups_P.append(groups_P[-1] + n_groups)
            rows_P.append(rows_P[-1] + len(part.group_N))
        rows_G = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
        off = np.zeros(len(rows_G) + 1, dtype=np.int64)
        np.cumsum(rows_G, out=off[1:])
        return cls(
            row_R=np.concatenate(rows) if rows else np.zeros(0, np.int64),
            off_G1=off,
            part_group0_P1=np.asarray(groups_P, dtype=np.int64),
            part_row0_P1=np.asarray(rows_P, dtype=np.int64),
            rows_G=rows_G,
            tokens_G=np.concatenate(tokens) if tokens else np.zeros(0, np.int64),
        )

    def rows_of(self, groups: np.ndarray) -> np.ndarray:
        """The global row numbers of ``groups``, group after group."""
        start = self.off_G1[groups]
        size = self.rows_G[groups]
        out_off = np.concatenate(([0], np.cumsum(size)))
        return self.row_R[np.arange(int(out_off[-1]), dtype=np.int64) + np.repeat(start - out_off[:-1], size)]


@dataclass
class _RankPlan:
    """One rank's batches of an epoch: batch ``k`` is the groups ``groups[bounds_K1[k]:bounds_K1[k + 1]]``."""

    groups: np.ndarray
    bounds_K1: np.ndarray
    dropped_rows: int = 0

    def __len__(self) -> int:
        return len(self.bounds_K1) - 1


class ShardLoader:
    """Batches of the shard rows under ``path`` for one rank (see the module docstring).

    ``layout``: ``"padded"`` (:class:`~prl.loaders.rows.PaddedBatch`), ``"packed"``
    (:class:`~prl.loaders.rows.PackedBatch`) or ``"rows"`` (:class:`~prl.loaders.rows.Rows`, what the framework
    adapters take). Exactly one of ``batch_rows`` / ``batch_tokens`` sizes the batches.
    """

    def __init__(
        self,
        path: str,
        *,
        batch_rows: int | None = None,
        batch_tokens: int | None = None,
        layout: Layout = "padded",
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_uneven: bool = True,
        pad_id: int = 0,
        pad_to: int | None = None,
    ) -> None:
        if (batch_rows is None) == (batch_tokens is None):
            raise UsageError("give exactly one of batch_rows and batch_tokens")
        if (batch_rows or batch_tokens or 0) < 1:
            raise UsageError("a batch must hold at least one row or token")
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is not in [0, world_size={world_size})")
        if layout not in ("padded", "packed", "rows"):
            raise UsageError(f"layout must be padded, packed or rows, not {layout!r}")
        self.path = path
        self.batch_rows, self.batch_tokens = batch_rows, batch_tokens
        self.layout: Layout = layout
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle, self.drop_uneven = seed, shuffle, drop_uneven
        self.pad_id, self.pad_to = pad_id, pad_to
        refs = resolve(path)
        self.set_ids = [r.set_id for r in refs]
        with_tokens = batch_tokens is not None
        parts = [(r.set_id, p) for r in refs for p in Manifest.of(r).part_paths(r)]
        self._parts = [_plan_part(path, set_id, with_tokens) for set_id, path in parts]
        self._groups = _Groups.of(self._parts)
        self.epoch = 0
        self._next_batch = 0
        self._cache: OrderedDict[int, tuple[np.ndarray | None, Rows]] = OrderedDict()
        self._epoch_rows = np.zeros(0, np.int64)
        self.dropped_rows = 0

    # --- plan ------------------------------------------------------------------------------------------------
    def _epoch_groups(self, epoch: int) -> np.ndarray:
        """Every group of the sets (numbers of :class:`_Groups`), in this epoch's order."""
        rng = np.random.default_rng((self.seed, epoch))
        n_parts = len(self._parts)
        part_order = rng.permutation(n_parts) if self.shuffle else np.arange(n_parts)
        group0 = self._groups.part_group0_P1
        pieces = []
        for p in part_order.tolist():
            n = int(group0[p + 1] - group0[p])
            pieces.append(group0[p] + (rng.permutation(n) if self.shuffle else np.arange(n)))
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)

    def _rank_batches(self, groups: np.ndarray, rank: int) -> _RankPlan:
        mine = groups[rank :: self.world_size]
        if not len(mine):
            return _RankPlan(mine, np.zeros(1, np.int64))
        if self.batch_rows is not None:
            size_G, budget = self._groups.rows_G[mine], self.batch_rows
        else:
            size_G, budget = self._groups.tokens_G[mine], self.batch_tokens  # type: ignore[assignment]
        start_G = np.concatenate(([0], np.cumsum(size_G)[:-1]))
        window_G = start_G // budget
        first = np.flatnonzero(np.diff(window_G)) + 1
        return _RankPlan(mine, np.concatenate(([0], first, [len(mine)])).astype(np.int64))

    def _plan(self, epoch: int) -> _RankPlan:
        groups = self._epoch_groups(epoch)
        per_rank = [self._rank_batches(groups, r) for r in range(self.world_size)]
        mine = per_rank[self.rank]
        self.dropped_rows = 0
        if self.drop_uneven:
            keep = min(len(b) for b in per_rank)
            cut = int(mine.bounds_K1[keep])
            self.dropped_rows = int(self._groups.rows_G[mine.groups[cut:]].sum())
            mine = _RankPlan(mine.groups[:cut], mine.bounds_K1[: keep + 1], self.dropped_rows)
        return mine

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (from its start)."""
        return len(self._plan(self.epoch))

    # --- reading ---------------------------------------------------------------------------------------------
    def _part_rows(self, p: int) -> tuple[np.ndarray | None, Rows]:
        """Part ``p``'s rows that this rank reads in the epoch, decoded once and kept while batches read from it
        (the last two parts): ``(their row numbers in the part, or None for all of them; the rows)``."""
        if p in self._cache:
            self._cache.move_to_end(p)
            return self._cache[p]
        row0 = self._groups.part_row0_P1
        lo, hi = np.searchsorted(self._epoch_rows, row0[p : p + 2])
        needed: np.ndarray | None = self._epoch_rows[lo:hi] - row0[p]
        schema = pq.read_schema(self._parts[p].path)
        columns = [c for c in (*ROW_COLUMNS, "temperature") if c in schema.names]
        table = pq.read_table(self._parts[p].path, columns=columns)
        if needed is not None and len(needed) == table.num_rows:
            needed = None  # every row: no take
        rows = Rows.from_arrow(table if needed is None else table.take(pa.array(needed)))
        self._cache[p] = (needed, rows)
        while len(self._cache) > 2:
            self._cache.popitem(last=False)
        return needed, rows

    def _read(self, plan: _RankPlan, k: int) -> Rows:
        """Batch ``k``: its groups' rows gathered by offsets, one gather per part it spans."""
        row_R = self._groups.rows_of(plan.groups[plan.bounds_K1[k] : plan.bounds_K1[k + 1]])
        row0 = self._groups.part_row0_P1
        part_R = np.searchsorted(row0, row_R, side="right") - 1
        cuts = np.concatenate(([0], np.flatnonzero(np.diff(part_R)) + 1, [len(row_R)]))
        pieces = []
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
            p = int(part_R[a])
            needed, rows = self._part_rows(p)
            local = row_R[a:b] - row0[p]
            pieces.append(rows.take(local if needed is None else np.searchsorted(needed, local)))
        return Rows.concat(pieces)

    def _shape(self, rows: Rows) -> Batch:
        if self.layout == "padded":
            return pad(rows, self.pad_to, self.pad_id)
        if self.layout == "packed":
            return pack(rows)
        return rows

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch's batches; afterwards the position moves to the next epoch's start."""
        plan = self._plan(self.epoch)
        self._cache.clear()
        self._epoch_rows = np.sort(self._groups.rows_of(plan.groups))
        while self._next_batch < len(plan):
            batch = self._shape(self._read(plan, self._next_batch))
            self._next_batch += 1
            yield batch
        self.epoch += 1
        self._next_batch = 0
        self._cache.clear()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch."""
        self.epoch, self._next_batch = epoch, 0

    # --- position --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position (next batch of the epoch) and what the plan depends on, JSON-serialisable."""
        return {
            "epoch": self.epoch,
            "next_batch": self._next_batch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "rank": self.rank,
            "world_size": self.world_size,
            "batch_rows": self.batch_rows,
            "batch_tokens": self.batch_tokens,
            "sets": list(self.set_ids),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s position. Raises :class:`~prl.errors.UsageError` when the sets or the settings
        that shape the plan differ (the same position would name other rows)."""
        for key in ("seed", "shuffle", "rank", "world_size", "batch_rows", "batch_tokens", "sets"):
            if state.get(key) != self.state_dict()[key]:
                raise UsageError(
                    f"cannot resume: {key} was {state.get(key)!r}, this loader has {self.state_dict()[key]!r}"
                )
        self.epoch, self._next_batch = int(state["epoch"]), int(state["next_batch"])
