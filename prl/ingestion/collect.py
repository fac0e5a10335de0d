"""The rows of one source, record by record: each record goes through its format's ``parse``, and its rows and
quarantine signals come out in source order. Runs of records the columnar road took
(:mod:`prl.ingestion.columnar`) join the batch as they come, as parts of their own between the rows of the
per-record road, and are cut where a batch fills as their records one by one would be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prl.formats.base import Format, ParseOptions, Quarantined, RawRecord, Sample
from prl.formats.guard import apply_options, as_quarantined, read_record
from prl.ingestion.assemble import Located, sample_id_of
from prl.ingestion.columnar import ColumnarRun
from prl.schema import RAW_LIMIT

RAW_KEEP = 4 * RAW_LIMIT + 4
"""Bytes of a kept record's raw text held until its batch is written: enough for the ``RAW_LIMIT``
characters (and the truncation flag) of a quarantine row, should the record turn out to be a duplicate;
holding whole SSE streams would cost hundreds of MB per batch."""

Quarantine = Callable[..., None]
"""``quarantine(line, raw, signal, sample_id=None, name=...)``: one quarantine row for the source."""


@dataclass
class Collector:
    """Rows of the source ``uri`` read by ``fmt``, in source order. ``rows`` / ``raws`` / ``tokens``: the
    batch so far (samples, their raw text up to :data:`RAW_KEEP` bytes, prompt + completion tokens)."""

    fmt: Format
    options: ParseOptions
    uri: str
    quarantine: Quarantine
    rows: list[Located] = field(default_factory=list)
    raws: list[bytes] = field(default_factory=list)
    tokens: int = 0
    parts: list[tuple[list[Located], list[bytes]] | ColumnarRun] = field(default_factory=list)
    """The batch's earlier parts, before ``rows``: runs of the columnar road (:mod:`prl.ingestion.columnar`)
    and the per-record rows read before each."""

    def add(self, record: RawRecord, position: str | None) -> str:
        """Read one decoded record (``position``: see :func:`prl.formats.guard.source_position`); returns the
        name of the format that read it."""
        name, parsed = read_record(self.fmt, record.obj, self.options, position)
        self._take(record.line, record.raw, record.obj, name, parsed)
        return name

    def add_run(self, run: ColumnarRun, batch_tokens: int) -> Iterator[None]:
        """Add a run of records the columnar road took as adding its records one by one would: yields each
        time the batch is full (``batch_tokens``), after the record that fills it, for the caller to take it."""
        while run.records:
            filled = self.tokens + np.cumsum(run.tokens)
            cut = int(np.searchsorted(filled, batch_tokens))  # the first record with the batch full
            if cut >= run.records:
                self._append(run)
                return
            head, run = run.split(cut + 1)
            self._append(head)
            yield

    def _append(self, run: ColumnarRun) -> None:
        if self.rows:
            self.parts.append((self.rows, self.raws))
            self.rows, self.raws = [], []
        self.parts.append(run)
        self.tokens += int(run.tokens.sum())

    def take(self) -> tuple[list[Located], list[bytes]]:
        """The batch so far of a collector given no columnar run; the collector starts a new one."""
        assert not self.parts, "a batch with columnar runs is taken by take_parts"
        rows, raws = self.rows, self.raws
        self.rows, self.raws, self.tokens = [], [], 0
        return rows, raws

    def take_parts(self) -> list[tuple[list[Located], list[bytes]] | ColumnarRun]:
        """The batch so far as its parts in source order: columnar runs, and (rows, raws) of the per-record
        road between them; the collector starts a new one."""
        parts = self.parts
        if self.rows:
            parts.append((self.rows, self.raws))
        self.parts, self.rows, self.raws, self.tokens = [], [], [], 0
        return parts

    def _take(self, line: int, raw: bytes, obj: Any, name: str, parsed: list[Sample | Quarantined]) -> None:
        for item in parsed:
            if isinstance(item, Quarantined):
                self.quarantine(line, raw, item, name=name)
                continue
            try:
                sample = apply_options(item, self.options, obj)  # validated with its batch
            except Exception as exc:  # whatever fails on one sample quarantines that sample
                q = as_quarantined(exc)
                q.choice_index = item.choice_index
                self.quarantine(line, raw, q, sample_id_of(item), name=name)
                continue
            self.rows.append(Located(sample, self.uri, line, name))
            self.raws.append(raw[:RAW_KEEP])
            self.tokens += len(sample.prompt_token_ids) + len(sample.completion_token_ids)


__all__ = ["RAW_KEEP", "Collector"]
