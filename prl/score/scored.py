"""One scored batch: its ``ref_logprobs`` rows written as a data file (not yet committed) and its refusals.

:func:`score_batch` runs wherever the backend runs (the driver, or a worker of another engine): it scores one
batch, validates the answers (:func:`prl.score.base.completion_logprobs`), writes the kept rows as one
``ref_logprobs`` data file and makes the quarantine rows of the refused samples. The driver commits what a
:class:`ScoredBatch` names (:mod:`prl.score.run`), the same on every engine.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake.transaction import AddAction

from prl.event_ids import ref_ids
from prl.formats.base import Quarantined
from prl.quarantine import quarantine_row
from prl.schema import REF_LOGPROBS
from prl.score.base import Backend, ScoreRequest
from prl.store.tables import PendingCommit, Store


@dataclass
class ScoredBatch:
    """Batch ``number`` of traces data file ``file`` (its index in the run's files), scored by backend
    ``backend`` from ``source``: the data file of its rows (``adds``, ``rows``, ``bytes``), the quarantine rows
    of its refusals, and what the run summary counts."""

    file: int
    number: int
    backend: str
    source: str
    adds: list[AddAction] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    quarantine_rows: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    input_tokens: int = 0
    completion_tokens: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    load_seconds: float = 0.0
    """Seconds the process that scored it spent loading its backend, when this was its first batch."""

    def pending(self, store: Store) -> PendingCommit:
        """The batch's rows, to be committed to ``store``'s ``ref_logprobs``."""
        return PendingCommit(store, "ref_logprobs", adds=list(self.adds), rows=self.rows, bytes=self.bytes)


def score_batch(
    store: Store, scorer: Backend, ref_model: str, batch: list[ScoreRequest], file: int, number: int
) -> ScoredBatch:
    """Score and validate ``batch``; its rows written as one ``ref_logprobs`` data file of ``store``."""
    outcomes = scorer.score(batch)
    now_ms = int(time.time() * 1000)
    kept = [(r, o) for r, o in zip(batch, outcomes, strict=True) if isinstance(o, np.ndarray)]
    refused = [(r, o) for r, o in zip(batch, outcomes, strict=True) if isinstance(o, Quarantined)]
    out = ScoredBatch(file, number, scorer.name, scorer.source, requests=len(batch))
    if kept:
        written = store.write_files("ref_logprobs", [_rows(kept, ref_model, scorer.source, now_ms)])
        out.adds, out.rows, out.bytes = written.adds, written.rows, written.bytes
    uri = f"score-ref:{ref_model}"
    out.quarantine_rows = [
        quarantine_row(uri, 0, scorer.name, _raw(r, ref_model), q, now_ms, sample_id=r.sample_id, table="ref_logprobs")
        for r, q in refused
    ]
    out.input_tokens = sum(r.tokens for r in batch)
    out.completion_tokens = sum(len(o) for _, o in kept)
    out.refused = dict(Counter(q.reason for _, q in refused))
    return out


def _raw(request: ScoreRequest, ref_model: str) -> bytes:
    """What a quarantine row keeps of a refused sample: its key and sizes (the tokens are in ``traces``)."""
    return json.dumps(
        {
            "sample_id": request.sample_id,
            "ref_model": ref_model,
            "prompt_tokens": len(request.prompt_ids),
            "completion_tokens": len(request.completion_ids),
        },
        sort_keys=True,
    ).encode()


def _rows(kept: list[tuple[ScoreRequest, np.ndarray]], ref_model: str, source: str, now_ms: int) -> pa.RecordBatch:
    """The ``ref_logprobs`` rows of a batch: ``ref_logprobs`` is list<float32> built from one flat buffer."""
    arrays = [np.asarray(o, dtype=np.float32) for _, o in kept]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = pa.array(np.concatenate(arrays) if arrays else np.zeros(0, np.float32), pa.float32())
    count = len(kept)
    columns = {
        "sample_id": pa.array([r.sample_id for r, _ in kept], pa.string()),
        "ref_model": pa.array([ref_model] * count, pa.string()),
        "ref_logprobs": pa.ListArray.from_arrays(pa.array(offsets), values),
        "source_uri": pa.array([source] * count, pa.string()),
        "source_line": pa.array(np.zeros(count, np.int64)),
        "ingested_at": pa.array(np.full(count, now_ms, np.int64)).cast(REF_LOGPROBS.field("ingested_at").type),
    }
    columns["event_id"] = ref_ids(columns["sample_id"].to_pylist(), [ref_model] * count, columns["ref_logprobs"])
    return pa.RecordBatch.from_pydict(columns, schema=REF_LOGPROBS)


__all__ = ["ScoredBatch", "score_batch"]
