"""check-tokens batches checked away from the driver (another engine's workers, :mod:`prl.engines`).

The driver describes the run in a :class:`CheckJob` (the store, the tokenizer as the driver loaded it, the
options, the traces version and files, the anti-join filter, the session index) and cuts the files' row groups
into tasks (:func:`row_group_pieces`). A worker runs :func:`check_pieces` on each task: the pending rows of those
row groups, checked by the same :class:`prl.checks.run.BatchChecker` the local engine uses, batch by batch, each
batch coming back as one :class:`CheckedBatch` (its verdict rows and the counts the run summary adds up). The
driver folds them into the summary and commits them exactly as the local engine does; nothing here writes to the
store.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds

from prl.bounds import TEMPLATE_TIMEOUTS
from prl.checks.options import CheckOptions
from prl.checks.verdict import RowVerdict
from prl.errors import UsageError
from prl.schema import CHECKS


@dataclass(frozen=True)
class CheckJob:
    """One check-tokens run as its workers need it. ``files``: traces data files to read (paths in the store's
    filesystem); ``pending``: the filter that leaves out samples already checked (None: none are);
    ``batch_size``: rows per checked batch."""

    store_uri: str
    tokenizer: str
    chat_template: str | None
    options: CheckOptions
    fingerprint: str
    traces_version: int
    sample_rate: float
    files: list[str]
    pending: ds.Expression | None
    sessions: pl.DataFrame
    batch_size: int
    template_timeouts: int = TEMPLATE_TIMEOUTS
    """Render time-outs each worker process allows before the rest get ``template_budget`` unrendered."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class CheckedBatch:
    """One checked batch: its verdict rows (``CHECKS`` schema) and what the run summary counts besides them."""

    verdicts: pa.RecordBatch
    sampled_out: int
    tokens: int
    tokens_encoded: int
    undetermined: dict[str, int]

    def flagged(self) -> list[RowVerdict]:
        """The rows with any reason, as :func:`prl.checks.verdict.assemble` reported them (detail decoded)."""
        out = self.verdicts
        reasons = out.column("reasons").to_pylist()
        verdicts = out.column("verdict").to_pylist()
        first = out.column("first_divergence").to_pylist()
        details = out.column("detail").to_pylist()
        return [
            RowVerdict(r, verdicts[r], codes, first[r], orjson.loads(details[r]) if details[r] else {})
            for r, codes in enumerate(reasons)
            if codes
        ]

    def status(self) -> list[str | None]:
        """Prefix status per row."""
        return self.verdicts.column("prefix_status").to_pylist()


_CHECKER: dict[str, Any] = {}
"""The checker of the run this worker process last served (run id → BatchChecker): a worker process serves
many blocks of one run, and loads the tokenizer once."""


def _checker(job: CheckJob) -> Any:
    from prl.checks.run import BatchChecker
    from prl.checks.tokenizer import CheckTokenizer
    from prl.store.tables import Store

    checker = _CHECKER.get(job.run_id)
    if checker is None:
        tok = CheckTokenizer.load(job.tokenizer, job.chat_template, job.options.stop_token_ids)
        if tok.fingerprint(job.options.to_dict()) != job.fingerprint:
            raise UsageError(
                f"the tokenizer {job.tokenizer} on this worker is not the driver's (fingerprint differs); "
                "every node must see the same tokenizer files"
            )
        _CHECKER.clear()
        store = Store(job.store_uri)
        checker = BatchChecker(
            store,
            tok,
            job.options,
            job.fingerprint,
            job.traces_version,
            job.sessions,
            template_timeouts=job.template_timeouts,
        )
        _CHECKER[job.run_id] = checker
    return checker


Piece = tuple[str, int]
"""One row group of a traces data file: (its path in the store's filesystem, its row group)."""


def row_group_pieces(store_uri: str, files: Sequence[str]) -> list[Piece]:
    """Every row group of ``files`` (one footer read per file), in file order: what a run's tasks are cut from, so
    that even one large file is checked by several workers."""
    from prl.store.tables import Store

    store = Store(store_uri)
    parquet = ds.ParquetFileFormat(default_fragment_scan_options=store.scan_options)
    pieces: list[Piece] = []
    for path in files:
        fragment = parquet.make_fragment(path, filesystem=store.fs)
        fragment.ensure_complete_metadata()
        pieces.extend((path, group) for group in range(max(1, fragment.num_row_groups)))
    return pieces


def check_pieces(job: CheckJob, pieces: Sequence[Piece]) -> Iterator[CheckedBatch]:
    """An engine's task: check the pending traces rows (``prl.checks.batch.COLUMNS``) of ``pieces``, in their
    order, in batches of ``job.batch_size``; one :class:`CheckedBatch` per batch."""
    from prl.checks.batch import COLUMNS
    from prl.checks.run import keep_sampled
    from prl.schema import TABLES
    from prl.store.tables import Store

    checker = _checker(job)
    store = Store(job.store_uri)
    parquet = ds.ParquetFileFormat(default_fragment_scan_options=store.scan_options)
    groups: dict[str, list[int]] = {}
    for path, group in pieces:
        groups.setdefault(path, []).append(group)
    fragments = [parquet.make_fragment(path, filesystem=store.fs, row_groups=rg) for path, rg in groups.items()]
    data = ds.FileSystemDataset(fragments, TABLES["traces"], parquet, store.fs)
    try:
        for rb in data.to_batches(columns=list(COLUMNS), filter=job.pending, batch_size=job.batch_size):
            if not rb.num_rows:
                continue
            checker.remember(rb)
            sampled_out = 0
            if job.sample_rate < 1.0:
                keep = keep_sampled(rb.column("sample_id").to_pylist(), job.sample_rate)
                sampled_out = int((~keep).sum())
                rb = rb.filter(pa.array(keep))
            stats = checker.roundtrip.stats
            tokens, encoded, undetermined = stats.tokens, stats.tokens_encoded, dict(checker.undetermined)
            if rb.num_rows:
                verdicts, _, _ = checker.check(rb)
            else:
                verdicts = pa.RecordBatch.from_pylist([], schema=CHECKS)
            gone = {k: v - undetermined.get(k, 0) for k, v in checker.undetermined.items()}
            yield CheckedBatch(
                verdicts,
                sampled_out,
                stats.tokens - tokens,
                stats.tokens_encoded - encoded,
                {k: v for k, v in gone.items() if v},
            )
    finally:
        checker.close()  # the render worker ends with the task (a later task starts a new one)


__all__ = ["CheckJob", "CheckedBatch", "check_pieces", "row_group_pieces"]
