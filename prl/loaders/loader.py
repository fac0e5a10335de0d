"""Iterate shard sets as training batches: sharded by rank with groups whole, shuffled per epoch, resumable.

``ShardLoader(path)`` reads one set folder or every current set of an ``OUT`` folder
(:func:`prl.shards.layout.resolve`). Planning reads only the small columns (``group_id``, and ``prompt_len`` +
``loss_mask`` lengths when batches are sized in tokens); a batch's rows are read when it is yielded.

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
        self.epoch = 0
        self._next_batch = 0
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self.dropped_rows = 0

    # --- plan ------------------------------------------------------------------------------------------------
    def _epoch_groups(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """Every group of the sets as ``(part index, its row numbers)``, in this epoch's order."""
        rng = np.random.default_rng((self.seed, epoch))
        part_order = rng.permutation(len(self._parts)) if self.shuffle else np.arange(len(self._parts))
        groups: list[tuple[int, np.ndarray]] = []
        for p in part_order.tolist():
            group_N = self._parts[p].group_N
            order = np.argsort(group_N, kind="stable")
            bounds = np.searchsorted(group_N[order], np.arange(int(group_N.max(initial=-1)) + 2))
            members = [order[bounds[g] : bounds[g + 1]] for g in range(len(bounds) - 1)]
            g_order = rng.permutation(len(members)) if self.shuffle else np.arange(len(members))
            groups.extend((p, members[g]) for g in g_order.tolist())
        return groups

    def _rank_batches(self, groups: list[tuple[int, np.ndarray]], rank: int) -> list[list[tuple[int, np.ndarray]]]:
        mine = groups[rank :: self.world_size]
        if not mine:
            return []
        if self.batch_rows is not None:
            size_G = np.array([len(rows) for _, rows in mine], dtype=np.int64)
            budget = self.batch_rows
        else:
            size_G = np.array([int(self._parts[p].tokens_N[rows].sum()) for p, rows in mine], dtype=np.int64)
            budget = self.batch_tokens  # type: ignore[assignment]
        start_G = np.concatenate(([0], np.cumsum(size_G)[:-1]))
        _, batch_G = np.unique(start_G // budget, return_inverse=True)
        batches: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(int(batch_G.max()) + 1)]
        for g, b in enumerate(batch_G.tolist()):
            batches[b].append(mine[g])
        return batches

    def _plan(self, epoch: int) -> list[list[tuple[int, np.ndarray]]]:
        groups = self._epoch_groups(epoch)
        per_rank = [self._rank_batches(groups, r) for r in range(self.world_size)]
        mine = per_rank[self.rank]
        self.dropped_rows = 0
        if self.drop_uneven:
            keep = min(len(b) for b in per_rank)
            self.dropped_rows = sum(len(rows) for batch in mine[keep:] for _, rows in batch)
            mine = mine[:keep]
        return mine

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (from its start)."""
        return len(self._plan(self.epoch))

    # --- reading ---------------------------------------------------------------------------------------------
    def _table(self, p: int) -> pa.Table:
        if p in self._cache:
            self._cache.move_to_end(p)
            return self._cache[p]
        schema = pq.read_schema(self._parts[p].path)
        columns = [c for c in (*ROW_COLUMNS, "temperature") if c in schema.names]
        table = pq.read_table(self._parts[p].path, columns=columns)
        self._cache[p] = table
        while len(self._cache) > 2:
            self._cache.popitem(last=False)
        return table

    def _read(self, batch: list[tuple[int, np.ndarray]]) -> Rows:
        pieces = [self._table(p).take(pa.array(rows)) for p, rows in batch]
        return Rows.from_arrow(pa.concat_tables(pieces, promote_options="permissive"))

    def _shape(self, rows: Rows) -> Batch:
        if self.layout == "padded":
            return pad(rows, self.pad_to, self.pad_id)
        if self.layout == "packed":
            return pack(rows)
        return rows

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch's batches; afterwards the position moves to the next epoch's start."""
        plan = self._plan(self.epoch)
        while self._next_batch < len(plan):
            batch = self._shape(self._read(plan[self._next_batch]))
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
