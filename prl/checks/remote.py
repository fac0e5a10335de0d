"""check-tokens' task: the batches of a run checked wherever the engine runs them (:mod:`prl.engines`).

The driver describes the run in a :class:`CheckJob` (the store, the tokenizer it loaded, the options, the traces
version and files, the anti-join filter, the session index) and cuts the files into tasks (:func:`pieces`: whole
files, or row groups when there are fewer files than tasks). Each task runs :func:`check_pieces`: the pending rows
of its pieces, checked by a :class:`prl.checks.run.BatchChecker` one batch ahead, each batch coming back as one
:class:`CheckedBatch` (its verdict rows and the counts the run summary adds up). The driver folds them into the
summary and commits them as they come; nothing here writes to the store. The local engine runs the one task in
the driver's process, which then uses the tokenizer the driver loaded (:func:`lending`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds

from prl.bounds import TEMPLATE_TIMEOUTS
from prl.checks.options import CheckOptions
from prl.checks.verdict import RowVerdict
from prl.errors import UsageError


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
    """Render time-outs each task allows before the rest of its conversations get ``template_budget`` unrendered."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Bytes of each of ``files`` as the Delta log gives them (a read then asks the store for no size: on S3, no
    HEAD per file)."""


@dataclass
class CheckedBatch:
    """One checked batch: its verdict rows (``CHECKS`` schema; None when every row was sampled out), its non-ok
    rows and prefix status per row (as :meth:`prl.checks.run.BatchChecker.finish` gives them), and what the run
    summary counts besides them (the checker's totals grown since the task's batch before)."""

    verdicts: pa.RecordBatch | None
    flagged: list[RowVerdict]
    status: list[str | None]
    sampled_out: int
    tokens: int = 0
    tokens_encoded: int = 0
    undetermined: dict[str, int] = field(default_factory=dict)


_TOKENIZERS: dict[str, Any] = {}
"""The tokenizer this process last loaded for a run (fingerprint → CheckTokenizer): a worker process serves many
tasks of one run and loads it once, and the driver's own tokenizer serves the tasks that run in its process."""


@contextlib.contextmanager
def lending(fingerprint: str, tok: Any) -> Iterator[None]:
    """While the driver runs a check: the tasks of the run with ``fingerprint`` that run in its process use
    ``tok`` (already loaded) instead of loading it again."""
    _keep(fingerprint, tok)
    try:
        yield
    finally:
        _TOKENIZERS.pop(fingerprint, None)


def _tokenizer(job: CheckJob) -> Any:
    from prl.checks.tokenizer import CheckTokenizer

    tok = _TOKENIZERS.get(job.fingerprint)
    if tok is None:
        tok = CheckTokenizer.load(job.tokenizer, job.chat_template, job.options.stop_token_ids)
        if tok.fingerprint(job.options.to_dict()) != job.fingerprint:
            raise UsageError(
                f"the tokenizer {job.tokenizer} on this worker is not the driver's (fingerprint differs); "
                "every node must see the same tokenizer files"
            )
        _keep(job.fingerprint, tok)
    return tok


def _keep(fingerprint: str, tok: Any) -> None:
    _TOKENIZERS.clear()  # one run's tokenizer at a time
    _TOKENIZERS[fingerprint] = tok


Piece = tuple[str, int | None]
"""Rows of a traces data file: (its path in the store's filesystem, one row group, or None: every row group)."""


def pieces(job: CheckJob, whole: bool) -> list[Piece]:
    """What a run's tasks are cut from, in file order: the files ``whole`` (no file is opened: the engine wants no
    more tasks than there are files), else every row group of each (one footer read per file), so that even one
    large file is checked by several workers."""
    if whole:
        return [(path, None) for path in job.files]
    from prl.store.tables import Store

    store = Store(job.store_uri)
    parquet = ds.ParquetFileFormat(default_fragment_scan_options=store.scan_options)
    out: list[Piece] = []
    for path in job.files:
        fragment = parquet.make_fragment(path, filesystem=store.fs, file_size=job.sizes.get(path))
        fragment.ensure_complete_metadata()
        out.extend((path, group) for group in range(max(1, fragment.num_row_groups)))
    return out


def pending_rows(job: CheckJob, pieces: Sequence[Piece]) -> Iterator[pa.RecordBatch]:
    """The pending traces rows (``prl.checks.batch.COLUMNS``) of ``pieces``, in their order, in batches of
    ``job.batch_size`` (empty batches left out), read as far ahead as the store's scans read."""
    from prl.checks.batch import COLUMNS
    from prl.schema import TABLES
    from prl.store.tables import READAHEAD_BATCHES, READAHEAD_FILES, Store

    store = Store(job.store_uri)
    parquet = ds.ParquetFileFormat(default_fragment_scan_options=store.scan_options)
    groups: dict[str, list[int]] = {}  # path → its row groups (none listed: the whole file)
    for path, group in pieces:
        groups.setdefault(path, []).extend(() if group is None else (group,))
    fragments = [
        parquet.make_fragment(path, filesystem=store.fs, file_size=job.sizes.get(path), row_groups=rg or None)
        for path, rg in groups.items()
    ]
    data = ds.FileSystemDataset(fragments, TABLES["traces"], parquet, store.fs)
    batches = data.to_batches(
        columns=list(COLUMNS),
        filter=job.pending,
        batch_size=job.batch_size,
        batch_readahead=READAHEAD_BATCHES,
        fragment_readahead=READAHEAD_FILES,
    )
    for rb in batches:
        if rb.num_rows:
            yield rb


def check_pieces(job: CheckJob, pieces: Sequence[Piece]) -> Iterator[CheckedBatch]:
    """An engine's task: check the pending rows of ``pieces`` (:func:`pending_rows`), one batch ahead: a batch is
    started (its round trip's tokenizer calls running on a thread of their own) before the one before it is
    finished. One :class:`CheckedBatch` per batch, in order; a batch whose rows were all sampled out comes out at
    once (it carries only its count). The task's first checked batch goes through the tokenizer/data mismatch
    guard first (:func:`prl.checks.run.guard_vocab`): on the local engine, the run's first batch."""
    from prl.checks.run import BatchChecker, keep_sampled
    from prl.store.tables import Store

    checker = BatchChecker(
        Store(job.store_uri),
        _tokenizer(job),
        job.options,
        job.fingerprint,
        job.traces_version,
        job.sessions,
        overlap=True,
        template_timeouts=job.template_timeouts,
    )
    stats = checker.roundtrip.stats
    told: tuple[int, int, dict[str, int]] = (0, 0, {})  # the totals the batches before carried

    def grown(verdicts: pa.RecordBatch | None, flagged: list[RowVerdict], status: list, out: int) -> CheckedBatch:
        nonlocal told
        tokens, encoded, undetermined = told
        told = (stats.tokens, stats.tokens_encoded, dict(checker.undetermined))
        gone = {k: v - undetermined.get(k, 0) for k, v in told[2].items() if v != undetermined.get(k, 0)}
        return CheckedBatch(verdicts, flagged, status, out, told[0] - tokens, told[1] - encoded, gone)

    try:
        ahead = None
        first = True
        for rb in pending_rows(job, pieces):
            checker.remember(rb)
            sampled_out = 0
            if job.sample_rate < 1.0:
                keep = keep_sampled(rb.column("sample_id").to_pylist(), job.sample_rate)
                sampled_out = int((~keep).sum())
                rb = rb.filter(pa.array(keep))
            if rb.num_rows == 0:
                yield grown(None, [], [], sampled_out)
                continue
            started = checker.start(rb, guard=first)
            first = False
            if ahead is not None:
                yield grown(*checker.finish(ahead[0]), ahead[1])
            ahead = (started, sampled_out)
        if ahead is not None:
            yield grown(*checker.finish(ahead[0]), ahead[1])
    finally:
        checker.close()  # the render worker and the tokenizer thread end with the task


__all__ = ["CheckJob", "CheckedBatch", "Piece", "check_pieces", "lending", "pending_rows", "pieces"]
