"""``prl score-ref``: reference logprobs for every sample that has none for the ``ref_model`` yet.

The samples to score are the ``traces`` rows (at the table's current version) whose ``sample_id`` has no
``ref_logprobs`` row with this ``ref_model``: the anti-join is answered from the two tables' ``sample_id``
columns, so a rerun scores only what is missing. Samples stream in batches of about ``batch_tokens`` tokens
(prompt + completion); each batch is scored, validated (:func:`prl.score.base.completion_logprobs`) and committed
to ``ref_logprobs`` in one atomic Delta commit, then its refusals to ``quarantine`` (reason codes of
:mod:`prl.score.base` and the backends; table ``ref_logprobs``, ``source_uri`` ``score-ref:<ref_model>``).
A run killed at any instant loses only its uncommitted batch; the next run scores the rest and duplicates
nothing. Quarantined samples have no row, so every run tries them again (a server that was briefly wrong may
answer well later); their quarantine rows are never repeated.

Only token IDs are sent, never text. The run holds the store's ``score-ref`` lock. A dry run selects and counts
the samples and tokens it would score, and neither loads the model nor calls the endpoint.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from prl.errors import ExitCode, UsageError
from prl.formats.base import Quarantined
from prl.ingestion.event_ids import ref_ids
from prl.ingestion.quarantine import new_quarantine_rows, quarantine_batches, quarantine_row
from prl.schema import REF_LOGPROBS
from prl.score.base import Backend, ScoreRequest
from prl.score.http import public_url
from prl.store.locks import holding
from prl.store.tables import Store

LOCK = "score-ref"
DEFAULT_BATCH_TOKENS = 16384
SCAN_ROWS = 2048
ENDPOINT_BACKENDS = ("vllm", "sglang", "tinker")


@dataclass
class ScoreResult:
    """What one ``prl score-ref`` did. ``input_tokens`` counts prompt + completion tokens sent to the model,
    ``completion_tokens`` the logprobs written; ``tokens_per_second`` is ``input_tokens`` over the scoring time
    (model and endpoint time, reads and commits included; loading the model, ``load_seconds``, excluded)."""

    store: str
    ref_model: str
    backend: str
    source: str
    candidates: int = 0
    """Samples that had no reference logprobs for ``ref_model`` when the run began."""
    scored: int = 0
    input_tokens: int = 0
    completion_tokens: int = 0
    batches: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    load_seconds: float = 0.0
    tokens_per_second: float = 0.0
    version: int | None = None
    """The ``ref_logprobs`` table version after the run."""
    dry_run: bool = False
    max_quarantine_rate: float = 0.05

    @property
    def exit_code(self) -> ExitCode:
        """1 when more than ``max_quarantine_rate`` of the samples looked at were quarantined, else 0."""
        refused = sum(self.quarantined.values())
        seen = self.scored + refused
        return ExitCode.DATA_PROBLEMS if seen and refused / seen > self.max_quarantine_rate else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "command": "score-ref", "exit_code": int(self.exit_code)}

    def headline(self) -> str:
        """``score-ref: 40 of 40 missing samples scored (ref, vllm), 0 quarantined, 12,000 tokens/s``."""
        return (
            f"score-ref{' (dry run)' if self.dry_run else ''}: {self.scored:,} of {self.candidates:,} missing "
            f"samples scored ({self.ref_model}, {self.backend}), {sum(self.quarantined.values()):,} quarantined, "
            f"{self.tokens_per_second:,.0f} tokens/s"
        )


def score_ref(
    store: Store | str,
    ref_model: str,
    *,
    endpoint: str | None = None,
    model: str | None = None,
    backend: str = "auto",
    served_model: str | None = None,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    concurrency: int = 8,
    retries: int = 5,
    timeout: float = 120.0,
    max_quarantine_rate: float = 0.05,
    dry_run: bool = False,
) -> ScoreResult:
    """Score every sample of ``store`` lacking reference logprobs for ``ref_model`` with one backend: an
    ``endpoint`` URL (``backend`` ``vllm``, ``sglang``, ``tinker`` — a Tinker service's base URL, with
    ``served_model`` the base model or ``tinker://`` checkpoint — or ``auto``: a URL ending in ``/generate`` is
    SGLang, anything else vLLM) or a local ``model`` folder. Raises :class:`UsageError` for bad options,
    :class:`~prl.errors.RetryableIOError` when the endpoint stays down (batches committed before are kept)."""
    if not ref_model:
        raise UsageError("--ref-model must name the reference model")
    if (endpoint is None) == (model is None):
        raise UsageError("give exactly one of --endpoint URL and --model PATH")
    if batch_tokens < 1:
        raise UsageError(f"--batch-tokens must be at least 1, got {batch_tokens}")
    store = store if isinstance(store, Store) else Store(store)
    kind = _backend_kind(endpoint, backend)
    if kind == "tinker" and not served_model:
        raise UsageError("--backend tinker needs --served-model: a base model name or a tinker:// checkpoint path")
    source = public_url(endpoint) if endpoint is not None else os.path.abspath(str(model))
    result = ScoreResult(store.uri, ref_model, kind, source, dry_run=dry_run)
    result.max_quarantine_rate = max_quarantine_rate
    started = time.perf_counter()
    with holding(store.uri, LOCK, enabled=not dry_run):
        todo = _missing(store, ref_model)
        if dry_run:
            for batch in _batches(todo, batch_tokens):
                result.candidates += len(batch)
                result.input_tokens += sum(r.tokens for r in batch)
                result.completion_tokens += sum(len(r.completion_ids) for r in batch)
        elif (first := next(todo, None)) is not None:  # nothing missing: the model is never loaded
            todo = itertools.chain([first], todo)
            loading = time.perf_counter()
            scorer = _open_backend(kind, endpoint, model, served_model, batch_tokens, concurrency, retries, timeout)
            result.load_seconds = time.perf_counter() - loading
            result.source = scorer.source
            try:
                for batch in _batches(todo, batch_tokens):
                    result.candidates += len(batch)
                    _score_batch(store, scorer, ref_model, batch, result)
            finally:
                scorer.close()
        result.version = store.version("ref_logprobs")
    result.seconds = time.perf_counter() - started
    scoring = result.seconds - result.load_seconds
    result.tokens_per_second = result.input_tokens / scoring if scoring > 0 and not dry_run else 0.0
    return result


def _backend_kind(endpoint: str | None, backend: str) -> str:
    if endpoint is None:
        if backend not in ("auto", "local"):
            raise UsageError(f"--backend {backend} needs --endpoint; --model PATH is the local backend")
        return "local"
    if backend == "auto":
        return "sglang" if endpoint.rstrip("/").endswith("/generate") else "vllm"
    if backend not in ENDPOINT_BACKENDS:
        raise UsageError(f"--backend must be auto, vllm, sglang or tinker with --endpoint, not {backend!r}")
    return backend


def _open_backend(
    kind: str,
    endpoint: str | None,
    model: str | None,
    served_model: str | None,
    batch_tokens: int,
    concurrency: int,
    retries: int,
    timeout: float,
) -> Backend:
    if kind == "local":
        from prl.score.local import LocalBackend

        assert model is not None
        return LocalBackend(model, batch_tokens=batch_tokens)
    from prl.score.http import RetryPolicy

    assert endpoint is not None
    client: dict[str, Any] = {"concurrency": concurrency, "timeout": timeout, "retry": RetryPolicy(retries=retries)}
    if kind == "sglang":
        from prl.score.sglang import SglangBackend

        return SglangBackend(endpoint, **client)
    if kind == "tinker":
        from prl.score.tinker import TinkerBackend

        return TinkerBackend(endpoint, served_model=served_model, **client)
    from prl.score.vllm import VllmBackend

    return VllmBackend(endpoint, served_model=served_model, **client)


# --- selection -------------------------------------------------------------------------------------------------
def _missing(store: Store, ref_model: str) -> Iterator[ScoreRequest]:
    """Requests for the traces rows with no ``ref_logprobs`` row for ``ref_model``, in scan order."""
    version = store.version("traces")
    if version is None:
        return
    done = store.read("ref_logprobs", columns=["sample_id"], filter=ds.field("ref_model") == ref_model)
    done_ids = done.column("sample_id").combine_chunks()
    where = ~ds.field("sample_id").isin(done_ids) if len(done_ids) else None
    columns = ["sample_id", "prompt_token_ids", "completion_token_ids"]
    for batch in store.scan("traces", columns=columns, filter=where, batch_size=SCAN_ROWS, version=version):
        yield from _requests(batch)


def _requests(batch: pa.RecordBatch) -> Iterator[ScoreRequest]:
    """One :class:`ScoreRequest` per row; token arrays are views of the batch's buffers."""
    ids = batch.column("sample_id").to_pylist()
    prompt, completion = batch.column("prompt_token_ids"), batch.column("completion_token_ids")
    p_off, p_val = prompt.offsets.to_numpy(), prompt.values.to_numpy()
    c_off, c_val = completion.offsets.to_numpy(), completion.values.to_numpy()
    for row, sample_id in enumerate(ids):
        yield ScoreRequest(sample_id, p_val[p_off[row] : p_off[row + 1]], c_val[c_off[row] : c_off[row + 1]])


def _batches(requests: Iterator[ScoreRequest], batch_tokens: int) -> Iterator[list[ScoreRequest]]:
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


# --- one batch -------------------------------------------------------------------------------------------------
def _score_batch(store: Store, scorer: Backend, ref_model: str, batch: list[ScoreRequest], result: ScoreResult) -> None:
    """Score, validate and commit one batch (rows, then its quarantine records)."""
    outcomes = scorer.score(batch)
    now_ms = int(time.time() * 1000)
    kept = [(r, o) for r, o in zip(batch, outcomes, strict=True) if isinstance(o, np.ndarray)]
    refused = [(r, o) for r, o in zip(batch, outcomes, strict=True) if isinstance(o, Quarantined)]
    if kept:
        store.commit(
            "ref_logprobs",
            [_rows(kept, ref_model, scorer.source, now_ms)],
            metadata={"command": "score-ref", "ref_model": ref_model, "backend": scorer.name, "source": scorer.source},
        )
    if refused:
        uri = f"score-ref:{ref_model}"
        rows = [
            quarantine_row(
                uri, 0, scorer.name, _raw(r, ref_model), q, now_ms, sample_id=r.sample_id, table="ref_logprobs"
            )
            for r, q in refused
        ]
        store.commit("quarantine", quarantine_batches(new_quarantine_rows(store, rows)))
    result.batches += 1
    result.scored += len(kept)
    result.input_tokens += sum(r.tokens for r in batch)
    result.completion_tokens += sum(len(o) for _, o in kept)
    counts = Counter(q.reason for _, q in refused)
    for reason, count in counts.items():
        result.quarantined[reason] = result.quarantined.get(reason, 0) + count


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
