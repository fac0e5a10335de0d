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
            comp_off_N1=_offsets(comp_len),
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
        )


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
