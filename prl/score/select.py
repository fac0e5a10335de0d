"""The samples a score-ref run scores, and its batches.

The samples to score are the ``traces`` rows (at the table's current version) whose ``sample_id`` has no
``ref_logprobs`` row for the ``ref_model``: the anti-join is answered from the two tables' ``sample_id`` columns
(:func:`pending`). Each traces data file is read on its own (:func:`file_batches`), and its rows, in file order,
are cut into batches of about ``batch_tokens`` tokens: a batch never spans two files, so the batches, and with them
what a batching backend computes, are the same whichever engine reads which file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds

from prl.score.base import ScoreRequest
from prl.store.changes import files_dataset, snapshot_files
from prl.store.tables import Store

SCAN_ROWS = 2048
COLUMNS = ["sample_id", "prompt_token_ids", "completion_token_ids"]


@dataclass(frozen=True)
class Pending:
    """What a run scores: the traces ``version``, its data files (``paths``, relative to the table folder, in the
    snapshot's order) and the filter that leaves out samples already scored (``where``; None: none are)."""

    version: int
    paths: list[str]
    where: ds.Expression | None

    def count(self, store: Store) -> int:
        """How many samples are to be scored (reads the ``sample_id`` column only)."""
        if not self.paths:
            return 0
        return files_dataset(store, "traces", self.paths).count_rows(filter=self.where)


def pending(store: Store, ref_model: str) -> Pending | None:
    """The samples of ``store`` with no reference logprobs for ``ref_model`` (None: no traces table)."""
    version = store.version("traces")
    if version is None:
        return None
    done = store.read("ref_logprobs", columns=["sample_id"], filter=ds.field("ref_model") == ref_model)
    done_ids = done.column("sample_id").combine_chunks()
    where = ~ds.field("sample_id").isin(done_ids) if len(done_ids) else None
    return Pending(version, snapshot_files(store, "traces", version), where)


def file_batches(
    store: Store, path: str, where: ds.Expression | None, batch_tokens: int
) -> Iterator[list[ScoreRequest]]:
    """The batches of one traces data file's pending rows (see the module docstring)."""
    rows = files_dataset(store, "traces", [path]).to_batches(columns=COLUMNS, filter=where, batch_size=SCAN_ROWS)
    return batched((request for batch in rows for request in requests(batch)), batch_tokens)


def requests(batch: pa.RecordBatch) -> Iterator[ScoreRequest]:
    """One :class:`ScoreRequest` per row; token arrays are views of the batch's buffers."""
    ids = batch.column("sample_id").to_pylist()
    prompt, completion = batch.column("prompt_token_ids"), batch.column("completion_token_ids")
    p_off, p_val = prompt.offsets.to_numpy(), prompt.values.to_numpy()
    c_off, c_val = completion.offsets.to_numpy(), completion.values.to_numpy()
    for row, sample_id in enumerate(ids):
        yield ScoreRequest(sample_id, p_val[p_off[row] : p_off[row + 1]], c_val[c_off[row] : c_off[row + 1]])


def batched(requests: Iterator[ScoreRequest], batch_tokens: int) -> Iterator[list[ScoreRequest]]:
    """Consecutive requests grouped until a group reaches ``batch_tokens`` tokens (at least one request each)."""
    batch: list[ScoreRequest] = []
    tokens = 0
    for request in requests:
        if batch and tokens + request.tokens > batch_tokens:
            yield batch
            batch, tokens = [], 0
        batch.append(request)
        tokens += request.tokens
    if batch:
        yield batch


__all__ = ["COLUMNS", "SCAN_ROWS", "Pending", "batched", "file_batches", "pending", "requests"]
