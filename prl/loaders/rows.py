"""Shard rows as ragged numpy arrays, and the two batch layouts trainers take: padded and packed.

Conventions (one letter per axis, as in the rest of prl): ``N`` rows, ``T`` tokens of every row's ``input_ids``
(prompt + completion) laid back to back, ``C`` completion tokens back to back, ``B`` rows of a batch, ``L`` the
padded length. ``seq_off_N1`` / ``comp_off_N1`` bound each row's tokens in the flat ``*_T`` / ``*_C`` arrays.

Sequence-aligned per-token values (``loss_mask_BL``, ``behavior_logprobs_BL`` …) sit at the position of the token
they describe: ``behavior_logprobs_BL[b, t]`` is log q(``input_ids_BL[b, t]`` | the tokens before it), so a model's
logits at ``t − 1`` are compared with position ``t``. Prompt and padding positions hold 0 and ``loss_mask`` False.

Safe values: a position stays in ``loss_mask`` only if every per-token value a loss multiplies there is present
and finite (behaviour logprob, token advantage, and the reference logprob / KL when the set has them). Positions
that fail are taken out of the mask (their values set to 0) and counted in :attr:`Rows.unsafe_positions`, so no
NaN reaches a loss even from a set written before prl enforced it at build time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROW_COLUMNS = (
    "sample_id",
    "group_id",
    "policy_version",
    "input_ids",
    "prompt_len",
    "loss_mask",
    "behavior_logprobs",
    "ref_logprobs",
    "kl",
    "token_advantages",
    "reward",
    "advantage",
    "group_size",
)
"""Shard columns a loader reads (``temperature`` is read too where the set has it)."""


def _combined(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    return column


def _lengths(column: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _offsets(lengths_N: np.ndarray) -> np.ndarray:
    off_N1 = np.zeros(len(lengths_N) + 1, dtype=np.int64)
    np.cumsum(lengths_N, out=off_N1[1:])
    return off_N1


def _flat(column: pa.Array, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """``(values, valid)`` of a list column's values, nulls as 0 (``valid`` False there; null rows give none)."""
    values = pc.list_flatten(column)
    valid = (
        np.ones(len(values), dtype=bool) if not values.null_count else values.is_valid().to_numpy(zero_copy_only=False)
    )
    if values.null_count:
        values = pc.fill_null(values, False if pa.types.is_boolean(values.type) else 0)
    data: np.ndarray = np.asarray(values.to_numpy(zero_copy_only=False), dtype=dtype)
    return data, valid


def _aligned(column: pa.Array, comp_len_N: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """A completion-aligned float column as ``(values_C float32, valid_C)``; None when every row is null.
    Rows that are null or not as long as their completion give zeros, not valid."""
    if column.null_count == len(column):
        return None
    ok_N = column.is_valid().to_numpy(zero_copy_only=False) & (_lengths(column) == comp_len_N)
    values_C = np.zeros(int(comp_len_N.sum()), dtype=np.float32)
    valid_C = np.zeros(len(values_C), dtype=bool)
    where_C = np.repeat(ok_N, comp_len_N)
    data, valid = _flat(column.filter(pa.array(ok_N)), np.float32)
    values_C[where_C] = data
    valid_C[where_C] = valid & np.isfinite(data)
    return values_C, valid_C


@dataclass
class Rows:
    """``N`` shard rows as numpy arrays (ragged arrays flat, with offsets); see the module docstring."""

    sample_id_N: np.ndarray
    group_id_N: np.ndarray
    policy_version_N: np.ndarray
    input_ids_T: np.ndarray
    seq_off_N1: np.ndarray
    prompt_len_N: np.ndarray
    comp_off_N1: np.ndarray
    loss_mask_C: np.ndarray
    behavior_logprobs_C: np.ndarray
    token_advantages_C: np.ndarray
    ref_logprobs_C: np.ndarray | None
    kl_C: np.ndarray | None
    reward_N: np.ndarray
    advantage_N: np.ndarray
    group_size_N: np.ndarray
    temperature_N: np.ndarray | None
    """Sampling temperature per row (float32, NaN where unknown); None when the set has no such column."""
    unsafe_positions: int = 0
    """Loss-mask positions taken out because a value there was null or not finite."""
    unsafe_N: np.ndarray | None = None
    """Those positions per row (int64), so that :meth:`take` counts them for the rows it takes."""

    @property
    def num_rows(self) -> int:
        return len(self.prompt_len_N)

    @property
    def seq_len_N(self) -> np.ndarray:
        return np.diff(self.seq_off_N1)

    @property
    def comp_len_N(self) -> np.ndarray:
        return np.diff(self.comp_off_N1)

    def completion_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """``(row_C, pos_C)``: each completion token's row and its position in that row's ``input_ids``."""
        row_C = np.repeat(np.arange(self.num_rows), self.comp_len_N)
        pos_C = np.arange(len(row_C)) - self.comp_off_N1[:-1][row_C] + self.prompt_len_N[row_C]
        return row_C, pos_C

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Rows:
        """Rows of a table in the shard schema (``prl.schema.SHARD``; extra columns are ignored)."""
        col = {name: _combined(table[name]) for name in table.column_names}
        ids, _ = _flat(col["input_ids"], np.int64)
        seq_off = _offsets(_lengths(col["input_ids"]))
        comp_len = _lengths(col["loss_mask"])
        comp_off = _offsets(comp_len)
        mask, mask_valid = _flat(col["loss_mask"], np.bool_)
        safe = mask_valid.copy()
        values: dict[str, np.ndarray | None] = {}
        for name in ("behavior_logprobs", "token_advantages", "ref_logprobs", "kl"):
            got = _aligned(col[name], comp_len) if name in col else None
            if got is None:
                if name in ("behavior_logprobs", "token_advantages"):
                    raise ValueError(f"shard rows have no {name}")
                values[name] = None
                continue
            arr, valid = got
            arr[~valid] = 0.0  # nulls and non-finite values never leave the loader
            values[name] = arr
            safe &= valid
        unsafe = mask & ~safe
        mask = mask & safe
        temperature = None
        if "temperature" in col:
            temperature = np.asarray(
                pc.fill_null(col["temperature"].cast(pa.float32()), np.nan).to_numpy(zero_copy_only=False)
            )
        return cls(
            sample_id_N=np.asarray(col["sample_id"].to_pylist(), dtype=object),
            group_id_N=np.asarray(col["group_id"].to_pylist(), dtype=object),
            policy_version_N=np.asarray(col["policy_version"].to_pylist(), dtype=object),
            input_ids_T=ids,
            seq_off_N1=seq_off,
            prompt_len_N=col["prompt_len"].to_numpy(zero_copy_only=False).astype(np.int64),
            comp_off_N1=comp_off,
            loss_mask_C=mask,
            behavior_logprobs_C=values["behavior_logprobs"],  # type: ignore[arg-type]
            token_advantages_C=values["token_advantages"],  # type: ignore[arg-type]
            ref_logprobs_C=values["ref_logprobs"],
            kl_C=values["kl"],
            reward_N=col["reward"].to_numpy(zero_copy_only=False).astype(np.float64),
            advantage_N=col["advantage"].to_numpy(zero_copy_only=False).astype(np.float64),
            group_size_N=col["group_size"].to_numpy(zero_copy_only=False).astype(np.int64),
            temperature_N=temperature,
            unsafe_positions=int(unsafe.sum()),
            unsafe_N=_row_sums(unsafe, comp_off),
        )

    def take(self, idx_B: np.ndarray) -> Rows:
        """The rows ``idx_B`` (in that order, repeats allowed) as new :class:`Rows`: per-row values indexed,
        ragged values gathered by their offsets (no per-row work in Python)."""
        idx_B = np.asarray(idx_B, dtype=np.int64)
        seq_src, seq_off = _ragged_source(self.seq_off_N1, idx_B)
        comp_src, comp_off = _ragged_source(self.comp_off_N1, idx_B)

        def comp(values_C: np.ndarray | None) -> np.ndarray | None:
            return None if values_C is None else values_C[comp_src]

        unsafe_N = None if self.unsafe_N is None else self.unsafe_N[idx_B]
        return Rows(
            sample_id_N=self.sample_id_N[idx_B],
            group_id_N=self.group_id_N[idx_B],
            policy_version_N=self.policy_version_N[idx_B],
            input_ids_T=self.input_ids_T[seq_src],
            seq_off_N1=seq_off,
            prompt_len_N=self.prompt_len_N[idx_B],
            comp_off_N1=comp_off,
            loss_mask_C=self.loss_mask_C[comp_src],
            behavior_logprobs_C=self.behavior_logprobs_C[comp_src],
            token_advantages_C=self.token_advantages_C[comp_src],
            ref_logprobs_C=comp(self.ref_logprobs_C),
            kl_C=comp(self.kl_C),
            reward_N=self.reward_N[idx_B],
            advantage_N=self.advantage_N[idx_B],
            group_size_N=self.group_size_N[idx_B],
            temperature_N=None if self.temperature_N is None else self.temperature_N[idx_B],
            unsafe_positions=0 if unsafe_N is None else int(unsafe_N.sum()),
            unsafe_N=unsafe_N,
        )

    @classmethod
    def concat(cls, parts: list[Rows]) -> Rows:
        """``parts`` one after another. Optional values (reference logprobs, KL, temperature) missing from some
        parts but not all are filled there as absent: 0.0 out of the loss mask for the per-token ones (the
        positions are counted unsafe when in the mask), NaN for temperature."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            raise ValueError("no rows to concatenate")

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in parts])

        def offsets(name: str) -> np.ndarray:
            return _offsets(np.concatenate([np.diff(getattr(p, name)) for p in parts]))

        mask_C = cat("loss_mask_C")
        unsafe_N = cat("unsafe_N") if all(p.unsafe_N is not None for p in parts) else None
        optional: dict[str, np.ndarray | None] = {}
        for name in ("ref_logprobs_C", "kl_C"):
            if all(getattr(p, name) is None for p in parts):
                optional[name] = None
                continue
            have_C = np.concatenate([np.full(len(p.loss_mask_C), getattr(p, name) is not None) for p in parts])
            optional[name] = np.concatenate(
                [
                    getattr(p, name) if getattr(p, name) is not None else np.zeros(len(p.loss_mask_C), np.float32)
                    for p in parts
                ]
            )
            lost_C = mask_C & ~have_C
            if lost_C.any():
                comp_off = offsets("comp_off_N1")
                unsafe_N = None if unsafe_N is None else unsafe_N + _row_sums(lost_C, comp_off)
                mask_C = mask_C & have_C
        temperature = None
        if any(p.temperature_N is not None for p in parts):
            temperature = np.concatenate(
                [
                    p.temperature_N if p.temperature_N is not None else np.full(p.num_rows, np.nan, np.float32)
                    for p in parts
                ]
            )
        return cls(
            sample_id_N=cat("sample_id_N"),
            group_id_N=cat("group_id_N"),
            policy_version_N=cat("policy_version_N"),
            input_ids_T=cat("input_ids_T"),
            seq_off_N1=offsets("seq_off_N1"),
            prompt_len_N=cat("prompt_len_N"),
            comp_off_N1=offsets("comp_off_N1"),
            loss_mask_C=mask_C,
            behavior_logprobs_C=cat("behavior_logprobs_C"),
            token_advantages_C=cat("token_advantages_C"),
            ref_logprobs_C=optional["ref_logprobs_C"],
            kl_C=optional["kl_C"],
            reward_N=cat("reward_N"),
            advantage_N=cat("advantage_N"),
            group_size_N=cat("group_size_N"),
            temperature_N=temperature,
            unsafe_positions=sum(p.unsafe_positions for p in parts) + int((cat("loss_mask_C") & ~mask_C).sum()),
            unsafe_N=unsafe_N,
        )


def _row_sums(flags_C: np.ndarray, off_N1: np.ndarray) -> np.ndarray:
    """How many of each row's flags (bounded by ``off_N1``) are set (int64)."""
    cum = np.zeros(len(flags_C) + 1, dtype=np.int64)
    np.cumsum(flags_C, out=cum[1:])
    return cum[off_N1[1:]] - cum[off_N1[:-1]]


def _ragged_source(off_N1: np.ndarray, idx_B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows ``idx_B`` of a ragged array bounded by ``off_N1``: the flat positions of their values, in
    order, and the new offsets."""
    start_B = off_N1[idx_B]
    len_B = off_N1[idx_B + 1] - start_B
    off_B1 = _offsets(len_B)
    src = np.arange(int(off_B1[-1]), dtype=np.int64) + np.repeat(start_B - off_B1[:-1], len_B)
    return src, off_B1


def pad_ragged(
    values: np.ndarray, off_N1: np.ndarray, width: int | None = None, fill: float | int = 0, left: bool = False
) -> np.ndarray:
    """A ``[N, width]`` array of the ragged rows ``values[off_N1[i]:off_N1[i + 1]]``, padded with ``fill`` on the
    right (or on the left); ``width`` defaults to the longest row. Raises ValueError if a row is longer."""
    lengths_N = np.diff(off_N1)
    width = int(lengths_N.max(initial=0)) if width is None else width
    if len(lengths_N) and int(lengths_N.max()) > width:
        raise ValueError(f"a row of {int(lengths_N.max())} tokens does not fit in {width}")
    out = np.full((len(lengths_N), width), fill, dtype=values.dtype)
    row_T = np.repeat(np.arange(len(lengths_N)), lengths_N)
    col_T = np.arange(len(row_T)) - off_N1[:-1][row_T]
    if left:
        col_T = col_T + (width - lengths_N)[row_T]
    out[row_T, col_T] = values[off_N1[0] : off_N1[-1]]
    return out


@dataclass
class PaddedBatch:
    """``B`` rows right-padded to ``L`` tokens, per-token values sequence-aligned (see the module docstring)."""

    input_ids_BL: np.ndarray
    attention_mask_BL: np.ndarray
    position_ids_BL: np.ndarray
    loss_mask_BL: np.ndarray
    behavior_logprobs_BL: np.ndarray
    token_advantages_BL: np.ndarray
    ref_logprobs_BL: np.ndarray | None
    kl_BL: np.ndarray | None
    rows: Rows


@dataclass
class PackedBatch:
    """``B`` rows back to back in one stream of ``T`` tokens: ``cu_seqlens_B1`` bounds each row (the
    ``cu_seqlens`` of varlen attention kernels) and ``position_ids_T`` restart at 0 for each row."""

    input_ids_T: np.ndarray
    position_ids_T: np.ndarray
    cu_seqlens_B1: np.ndarray
    loss_mask_T: np.ndarray
    behavior_logprobs_T: np.ndarray
    token_advantages_T: np.ndarray
    ref_logprobs_T: np.ndarray | None
    kl_T: np.ndarray | None
    rows: Rows


def _scatter_completion(
    rows: Rows, values_C: np.ndarray | None, shape: tuple[int, ...], flat: bool
) -> np.ndarray | None:
    """Completion-aligned values placed at their sequence positions of a ``[B, L]`` (or flat ``[T]``) array."""
    if values_C is None:
        return None
    out = np.zeros(shape, dtype=values_C.dtype)
    row_C, pos_C = rows.completion_positions()
    if flat:
        out[rows.seq_off_N1[:-1][row_C] + pos_C] = values_C
    else:
        out[row_C, pos_C] = values_C
    return out


def pad(rows: Rows, length: int | None = None, pad_id: int = 0) -> PaddedBatch:
    """``rows`` right-padded to ``length`` tokens (default: the longest row) with ``pad_id``."""
    seq_len = rows.seq_len_N
    input_ids = pad_ragged(rows.input_ids_T, rows.seq_off_N1, length, pad_id)
    width = input_ids.shape[1]
    attention = np.arange(width)[None, :] < seq_len[:, None]
    positions = np.where(attention, np.arange(width)[None, :], 0).astype(np.int64)
    shape = input_ids.shape
    return PaddedBatch(
        input_ids_BL=input_ids,
        attention_mask_BL=attention,
        position_ids_BL=positions,
        loss_mask_BL=_scatter_completion(rows, rows.loss_mask_C, shape, False),  # type: ignore[arg-type]
        behavior_logprobs_BL=_scatter_completion(rows, rows.behavior_logprobs_C, shape, False),  # type: ignore[arg-type]
        token_advantages_BL=_scatter_completion(rows, rows.token_advantages_C, shape, False),  # type: ignore[arg-type]
        ref_logprobs_BL=_scatter_completion(rows, rows.ref_logprobs_C, shape, False),
        kl_BL=_scatter_completion(rows, rows.kl_C, shape, False),
        rows=rows,
    )


def pack(rows: Rows) -> PackedBatch:
    """``rows`` back to back in one token stream (no padding), with per-row position ids and ``cu_seqlens``."""
    total = int(rows.seq_off_N1[-1])
    seq_len = rows.seq_len_N
    row_T = np.repeat(np.arange(rows.num_rows), seq_len)
    positions = np.arange(total, dtype=np.int64) - rows.seq_off_N1[:-1][row_T]
    shape = (total,)
    return PackedBatch(
        input_ids_T=rows.input_ids_T.copy(),
        position_ids_T=positions,
        cu_seqlens_B1=rows.seq_off_N1.astype(np.int32),
        loss_mask_T=_scatter_completion(rows, rows.loss_mask_C, shape, True),  # type: ignore[arg-type]
        behavior_logprobs_T=_scatter_completion(rows, rows.behavior_logprobs_C, shape, True),  # type: ignore[arg-type]
        token_advantages_T=_scatter_completion(rows, rows.token_advantages_C, shape, True),  # type: ignore[arg-type]
        ref_logprobs_T=_scatter_completion(rows, rows.ref_logprobs_C, shape, True),
        kl_T=_scatter_completion(rows, rows.kl_C, shape, True),
        rows=rows,
    )
