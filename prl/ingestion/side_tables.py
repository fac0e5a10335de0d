"""``prl ingest --kind rewards|ref``: reward events and reference-model logprobs into their tables.

Reward files (JSONL, CSV or Parquet; gz/zst for JSONL) hold one event per row, keyed by ``sample_id`` or by
``request_id`` + ``choice_index`` (→ ``request_id#choice_index``), in any of these shapes:

- long: ``{"sample_id", "name", "value", "created_at"?}``;
- one value: ``{"sample_id", "reward": 0.7}`` (name ``reward``);
- components: ``{"sample_id", "rewards": {"correct": 1, "format": 0.5}}`` (also ``components``).

``created_at`` (ISO-8601, seconds or milliseconds) orders events; without it the ingest time does. A later event
for the same (sample_id, name) supersedes an earlier one when shards are built. Reference logprob files are JSONL
``{"sample_id" | "request_id"+"choice_index", "ref_model", "ref_logprobs": [...]}``.

Bad rows are quarantined (table ``rewards`` or ``ref_logprobs``) with a reason: ``missing_key``,
``missing_value``, ``bad_value``, ``nonfinite_reward``, ``bad_logprob``, ``nonfinite_logprob``,
``positive_logprob``, ``bad_timestamp``, ``malformed_json``, ``truncated_line`` (a last line left unfinished by a
file that stopped changing). Files already consumed (same uri, size, mtime) are skipped. Every row has an
``event_id``, a digest of its content (:mod:`prl.event_ids`); a file read again, grown, rotated (same
name, new content) or copied under another name adds exactly the events not in the table yet. A plain JSONL file
that grew is read on from where the last run stopped (:mod:`prl.ingestion.side_resume`), its event ids numbered
on from the counts that run recorded, so each run costs the file's new bytes.

Two roads read the rows. Blocks in the common shapes (a JSONL block of whole lines, a CSV or Parquet batch; keys
by ``sample_id`` or ``request_id`` + ``choice_index``, one event per row, lists of logprobs) are read columnar
(:mod:`prl.ingestion.rewards_columnar`, :mod:`prl.ingestion.ref_columnar`); any other block, or one holding a bad
row, is read row by row (:func:`reward_events`, :func:`ref_row`), the reference road, which explains every bad
row. Both give the same rows, ids and quarantine.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from prl import bounds
from prl.errors import ExitCode
from prl.event_ids import Occurrences, ref_id, reward_content
from prl.formats.base import Quarantined, decode_json_line, logprob_array
from prl.formats.fields import timestamp_ms
from prl.formats.guard import FLOAT32_MAX
from prl.ingestion.assemble import list_column
from prl.ingestion.ref_columnar import ref_table
from prl.ingestion.resume import app_id as resume_app_id
from prl.ingestion.resume import earlier_entries
from prl.ingestion.rewards_columnar import json_block, reward_table
from prl.ingestion.side_resume import SideStart, open_file, resume_entry
from prl.io import sources as io_sources
from prl.io.sources import LineReader, SourceFile, lines_of, scan
from prl.kernel import Work, execute
from prl.quarantine import new_quarantine_rows, quarantine_batches, quarantine_row
from prl.schema import REF_LOGPROBS, REWARDS
from prl.store.index import EVENT_INDEXES, SampleIndex
from prl.store.resolve import open_store
from prl.store.tables import Store, filesystem_for
from prl.store.txns import transactions
from prl.text import counted

KINDS = {"rewards": "rewards", "ref": "ref_logprobs"}
BATCH_ROWS = 50_000


@dataclass
class SideIngestResult:
    """Summary of a rewards / reference-logprob ingest."""

    store: str
    table: str
    files: int = 0
    unchanged_files: int = 0
    rows: int = 0
    already_present: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    version: int | None = None
    dry_run: bool = False
    held_back_bytes: int = 0
    """Bytes of unfinished last lines left for a later run (files still being written)."""
    bytes_read: int = 0
    """Bytes of JSONL files read this run (of a file read on from an earlier run, those after its resume point)."""
    resumed_from: dict[str, int] = field(default_factory=dict)
    """Files read on from where an earlier run stopped: URI → the byte this run began at."""
    problems: list[dict[str, str]] = field(default_factory=list)
    """Entries not read (``uri``, ``status`` skipped | failed, ``reason``): see :class:`prl.io.sources.SourceProblem`."""

    @property
    def exit_code(self) -> ExitCode:
        if any(p["status"] == "failed" for p in self.problems):
            return ExitCode.USAGE
        seen = self.rows + sum(self.quarantined.values())
        return (
            ExitCode.DATA_PROBLEMS
            if seen and sum(self.quarantined.values()) / seen > bounds.MAX_QUARANTINE_RATE
            else ExitCode.OK
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "command": f"ingest --kind {self.table}", "exit_code": int(self.exit_code)}

    def headline(self) -> str:
        """``ingest --kind rewards: 20 rows written, 0 already present, 2 quarantined; 1 file read, 0 unchanged``."""
        return (
            f"ingest --kind {self.table}{' (dry run)' if self.dry_run else ''}: {counted(self.rows, 'row')} written, "
            f"{self.already_present:,} already present, {sum(self.quarantined.values()):,} quarantined; "
            f"{counted(self.files, 'file')} read, {self.unchanged_files} unchanged"
        )


def _key(row: dict[str, Any]) -> str:
    sample_id = row.get("sample_id")
    if isinstance(sample_id, str) and sample_id:
        return sample_id
    request_id, choice = row.get("request_id"), row.get("choice_index")
    if isinstance(request_id, str) and request_id and isinstance(choice, (int, float)) and not isinstance(choice, bool):
        if float(choice).is_integer():
            return f"{request_id}#{int(choice)}"
    raise Quarantined("missing_key", "row has neither sample_id nor request_id + integer choice_index")


def _number(value: Any, name: str) -> float:
    if value is None:
        raise Quarantined("missing_value", f"reward {name!r} has no value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise Quarantined("bad_value", f"reward {name!r} is {value!r}, not a number") from None
        else:
            raise Quarantined("bad_value", f"reward {name!r} is {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise Quarantined("nonfinite_reward", f"reward {name!r} is {value}")
    return float(value)


def reward_events(row: dict[str, Any], now_ms: int) -> list[dict[str, Any]]:
    """Normalise one input row to reward events ``{sample_id, name, value, created_at, stamped}`` (``stamped``:
    the time came from the row, else it is ``now_ms``)."""
    sample_id = _key(row)
    stamp = row.get("created_at", row.get("timestamp"))
    created = timestamp_ms(stamp)
    stamped = created is not None
    if created is None:
        if stamp is not None:  # a time that cannot be read must not silently become "now" and win
            raise Quarantined("bad_timestamp", f"created_at {stamp!r} is not epoch seconds/ms or ISO-8601")
        created = now_ms
    if "name" in row and "value" in row:
        pairs = [(str(row["name"]), row["value"])]
    elif isinstance(row.get("rewards"), dict) or isinstance(row.get("components"), dict):
        components = row.get("rewards") if isinstance(row.get("rewards"), dict) else row["components"]
        pairs = [(str(k), v) for k, v in components.items()]  # type: ignore[union-attr]
        if not pairs:
            raise Quarantined("missing_value", "empty reward components")
    elif "reward" in row:
        pairs = [("reward", row["reward"])]
    else:
        raise Quarantined("missing_value", "row has no name/value, reward, rewards or components field")
    return [
        {"sample_id": sample_id, "name": name, "value": _number(v, name), "created_at": created, "stamped": stamped}
        for name, v in pairs
    ]


def ref_row(row: dict[str, Any]) -> dict[str, Any]:
    """Validate one reference-logprob row → ``{sample_id, ref_model, ref_logprobs}``."""
    sample_id = _key(row)
    model = row.get("ref_model") or row.get("model")
    if not isinstance(model, str) or not model:
        raise Quarantined("missing_value", "row has no ref_model")
    values = row.get("ref_logprobs", row.get("logprobs"))
    array = logprob_array(values, "ref_logprobs")
    if array.null_count:
        raise Quarantined("bad_logprob", "ref_logprobs has null entries")
    numbers = array.to_numpy(zero_copy_only=False)
    if not np.isfinite(numbers).all():
        raise Quarantined(
            "nonfinite_logprob", f"non-finite ref logprob at position {int(np.flatnonzero(~np.isfinite(numbers))[0])}"
        )
    if (numbers > 0).any():
        raise Quarantined("positive_logprob", f"positive ref logprob at position {int(np.flatnonzero(numbers > 0)[0])}")
    if (numbers < -FLOAT32_MAX).any():  # stored as float32: it would become -inf
        at = int(np.flatnonzero(numbers < -FLOAT32_MAX)[0])
        raise Quarantined("out_of_range", f"ref logprob {numbers[at]:g} at position {at} is beyond float32")
    return {"sample_id": sample_id, "ref_model": model, "ref_logprobs": array}


def _arrow_batches(src: SourceFile) -> Iterator[pa.RecordBatch]:
    """The record batches of a CSV or Parquet file, as Arrow reads them."""
    fs, path = filesystem_for(src.uri)
    if src.uri.lower().endswith(".parquet"):
        with fs.open_input_file(path) as fh:
            yield from pq.ParquetFile(fh).iter_batches(BATCH_ROWS)
        return
    with fs.open_input_stream(path) as fh:
        yield from pacsv.open_csv(fh)


def _batch_rows(
    batch: pa.RecordBatch, first_line: int
) -> Iterator[tuple[int, bytes, dict[str, Any] | None, Quarantined | None]]:
    """(line, raw, row, error) of a CSV or Parquet batch, rows numbered from ``first_line`` (header excluded)."""
    for line, row in enumerate(batch.to_pylist(), start=first_line):
        yield line, repr(row).encode(), row, None


def _json_rows(
    lines: Iterable[tuple[int, bytes]],
) -> Iterator[tuple[int, bytes, dict[str, Any] | None, Quarantined | None]]:
    for line_no, raw in lines:
        if not raw.strip():
            continue
        record = decode_json_line(line_no, raw)
        if record.error is not None:
            yield line_no, raw, None, record.error
        elif not isinstance(record.obj, dict):
            yield line_no, raw, None, Quarantined("bad_shape", "row is not a JSON object")
        else:
            yield line_no, raw, record.obj, None


def _is_jsonl(uri: str) -> bool:
    name = uri.lower()
    return not (name.endswith(".parquet") or name.endswith(".csv"))


def ingest_side_table(
    sources: list[str],
    store: Store | str,
    *,
    kind: str,
    dry_run: bool = False,
    lock: bool = True,
    partial_line_grace: float | None = None,
) -> SideIngestResult:
    """Ingest reward events (``kind="rewards"``) or reference logprobs (``kind="ref"``) into ``store``.

    Events already in the table are recognised by content (``event_id``, :mod:`prl.event_ids`),
    looked up in the table's event index, so a re-read, grown, rotated or renamed file adds exactly what is new.
    ``partial_line_grace``: as in :func:`prl.ingestion.traces.ingest` (a JSONL file still being written keeps its
    unfinished last line for a later run and is not marked consumed)."""
    table = KINDS[kind]
    store = open_store(store, create=True, writing=not dry_run)
    started = time.perf_counter()
    result = SideIngestResult(store=store.uri, table=table, dry_run=dry_run)
    found = scan(sources)
    files = found.files
    result.problems = [asdict(p) for p in found.problems]
    grace = io_sources.partial_line_grace() if partial_line_grace is None else partial_line_grace
    step = SideStep(result, files, grace, dry_run, f"ingest-{table}")
    return execute(step, store, lock=lock, started=started)


@dataclass
class SideStep:
    """A side-table ingest as the kernel runs it (:mod:`prl.kernel`): one work per file the ledger does not
    hold, with no tasks: its commit reads the file (on from its resume point) and commits its new events."""

    result: SideIngestResult
    files: list[SourceFile]
    grace: float
    dry_run: bool
    lock: str
    version: int | None = None
    """The table's version after the last file's commit."""
    index: SampleIndex | None = None

    def plan(self, store: Store, width: Callable[..., int]) -> Generator[Work, None, None]:
        result, table = self.result, self.result.table
        txns = transactions(store, table, store.latest(table))  # one pass over the log for every file
        self.index = SampleIndex(store, write=not self.dry_run, spec=EVENT_INDEXES[table])
        pending = []
        for src in self.files:
            if txns.lookup(f"prl.source:{src.identity}") is not None:
                result.unchanged_files += 1
                continue
            pending.append(src)
        entries = earlier_entries(store, table, txns, [src.uri for src in pending if _is_jsonl(src.uri)])
        self.version = txns.table_version
        for src in pending:
            result.files += 1
            yield Work(state=(src, entries.get(src.uri)))
        result.version = store.version_seen(table)

    def commit(self, store: Store, work: Work, outputs: Iterator[Any]) -> None:
        assert self.index is not None
        src, earlier = work.state
        result = self.result
        self.version = _ingest_one(
            src, store, result.table, result, self.dry_run, self.index, self.grace, earlier, self.version
        )

    def finish(self, seconds: float) -> SideIngestResult:
        self.result.seconds = seconds
        return self.result


@dataclass
class _FileRun:
    """One side-table file being read: its rows' ids, what the table holds, what this file adds."""

    src: SourceFile
    table: str
    index: SampleIndex
    result: SideIngestResult
    now_ms: int
    occurrences: Occurrences = field(default_factory=Occurrences)
    added: dict[str, str] = field(default_factory=dict)
    """event_id → sample_id of the rows this file's commit adds."""

    def item_id(self, item: dict[str, Any], stamped: bool) -> str:
        """The ``event_id`` of one slow-path row (reward event or reference row), in file order."""
        if self.table == "rewards":
            content = reward_content(
                item["sample_id"], item["name"], item["value"], item["created_at"] if stamped else None
            )
            return self.occurrences.ids([content])[0]
        values = item["ref_logprobs"].to_numpy(zero_copy_only=False)
        return ref_id(item["sample_id"], item["ref_model"], values)

    def fresh(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` not yet in the table (by ``event_id``) nor earlier in this file; the others are
        counted as already present."""
        ids = batch.column("event_id").to_pylist()
        sample_ids = batch.column("sample_id").to_pylist()
        known = {} if self.index.holds_nothing() else self.index.lookup(ids)  # a new table: nothing to look up
        added = self.added
        if not known and added.keys().isdisjoint(ids) and len(set(ids)) == len(ids):  # all new: no row loop
            added.update(zip(ids, sample_ids, strict=True))
            return batch
        keep = []
        for i, event in enumerate(ids):
            if event in added or event in known:
                continue
            keep.append(i)
            added[event] = sample_ids[i]
        self.result.already_present += len(ids) - len(keep)
        return batch if len(keep) == len(ids) else batch.take(pa.array(keep, pa.int64()))


def _ingest_one(
    src: SourceFile,
    store: Store,
    table: str,
    result: SideIngestResult,
    dry_run: bool,
    index: SampleIndex,
    grace: float,
    earlier: dict[str, Any] | None,
    version: int | None,
) -> int | None:
    """Read and commit one file (on from the resume point of ``earlier``, its newest ledger entry with one,
    when the file still begins with what that run consumed); returns the table's version after it
    (``version``: before it)."""
    now_ms = int(time.time() * 1000)
    index.refresh()
    hold = src.changed_within(grace)
    if _is_jsonl(src.uri):
        start = open_file(src, table, earlier, hold)
    else:  # CSV and Parquet are read whole
        start = SideStart(LineReader(src, hold_partial=hold), Occurrences())
    reader = start.reader
    run = _FileRun(src, table, index, result, now_ms, occurrences=start.occurrences)
    counts: Counter[str] = Counter()
    quarantined: list[dict[str, Any]] = []

    def events(
        rows: Iterable[tuple[int, bytes, dict[str, Any] | None, Quarantined | None]],
    ) -> Iterator[dict[str, Any]]:
        for line, raw, row, error in rows:
            try:
                if error is not None:
                    if reader.unterminated_line == line:
                        error = Quarantined("truncated_line", "the file's last line is incomplete")
                    raise error
                assert row is not None
                produced = reward_events(row, now_ms) if table == "rewards" else [ref_row(row)]
            except Quarantined as q:
                counts[q.reason] += 1
                quarantined.append(quarantine_row(src.uri, line, table, raw, q, now_ms, table=table))
                continue
            for item in produced:
                stamped = item.pop("stamped", True)
                item.update(
                    source_uri=src.uri, source_line=line, ingested_at=now_ms, event_id=run.item_id(item, stamped)
                )
                yield item

    def batches() -> Iterator[pa.RecordBatch]:
        jsonl = _is_jsonl(src.uri)
        for batch in _jsonl_batches(reader, run, events) if jsonl else _file_batches(src, run, events):
            yield run.fresh(batch)

    pending = store.write_files(table, batches(), dry_run=dry_run)
    if quarantined:
        store.commit("quarantine", quarantine_batches(new_quarantine_rows(store, quarantined)), dry_run=dry_run)
    entry, transactions = _ledger(src, reader, table, run.occurrences, version)
    committed = pending.commit(metadata={"sources": [entry], "command": f"ingest-{table}"}, transactions=transactions)
    if not dry_run:
        index.committed(committed.version, run.added)
    result.rows += pending.rows
    result.held_back_bytes += reader.held_back
    result.bytes_read += reader.bytes_read
    if start.resumed:
        result.resumed_from[src.uri] = reader.start
    for reason, count in counts.items():
        result.quarantined[reason] = result.quarantined.get(reason, 0) + count
    return version if committed.version is None else committed.version


def _ledger(
    src: SourceFile, reader: LineReader, table: str, occurrences: Occurrences, version: int | None
) -> tuple[dict[str, Any], dict[str, int]]:
    """The file's ledger entry and the commit's Delta txns: the file's identity once it is consumed whole (a
    file still being written is read again, on from its point), and the resume app id naming the commit that
    holds a resume point (:mod:`prl.ingestion.resume`; ``version``: the table's version before the commit)."""
    complete = not reader.held_back
    entry: dict[str, Any] = {"uri": src.uri, "size": src.size, "mtime_ns": src.mtime_ns}
    transactions = {f"prl.source:{src.identity}": 1} if complete else {}
    if _is_jsonl(src.uri):
        consumed = reader.start + reader.bytes_read - reader.held_back
        entry.update(read_from=reader.start, bytes_consumed=consumed, complete=complete)
        entry.update(resume_entry(reader, table, occurrences))
        if "resume" in entry:
            transactions[resume_app_id(src.uri)] = 1 if version is None else version + 1
    return entry, transactions


def _row_batches(items: Iterable[dict[str, Any]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    buffer: list[dict[str, Any]] = []
    for item in items:
        buffer.append(item)
        if len(buffer) >= BATCH_ROWS:
            yield _batch(buffer, schema)
            buffer = []
    if buffer:
        yield _batch(buffer, schema)


Events = Callable[[Iterable[tuple[int, bytes, dict[str, Any] | None, Quarantined | None]]], Iterator[dict[str, Any]]]
"""The per-row reader: (line, raw, row, error) in, validated rows (or quarantined ones) out."""


def _columnar(run: _FileRun, table: pa.Table, first_line: int) -> pa.RecordBatch | None:
    """Rows of one block already in Arrow, read columnar (:mod:`prl.ingestion.rewards_columnar`,
    :mod:`prl.ingestion.ref_columnar`), or None when they take the per-row road."""
    if run.table == "rewards":
        fast = reward_table(table, first_line, run.src.uri, run.now_ms, run.occurrences)
        return None if fast is None else fast[0]
    return ref_table(table, first_line, run.src.uri, run.now_ms)


def _jsonl_batches(reader: LineReader, run: _FileRun, events: Events) -> Iterator[pa.RecordBatch]:
    """Rows of a JSONL source: blocks in the common shapes columnar, any other block row by row through
    ``events`` (the reference road, which explains every bad row)."""
    schema = REWARDS if run.table == "rewards" else REF_LOGPROBS
    for first, block in reader.blocks():
        table = json_block(block)
        fast = None if table is None else _columnar(run, table, first)
        if fast is not None:
            yield fast
            continue
        yield from _row_batches(events(_json_rows(lines_of([(first, block)]))), schema)


def _file_batches(src: SourceFile, run: _FileRun, events: Events) -> Iterator[pa.RecordBatch]:
    """Rows of a CSV or Parquet source: each batch columnar when it is in the common shapes, else row by row."""
    schema = REWARDS if run.table == "rewards" else REF_LOGPROBS
    line = 1
    for batch in _arrow_batches(src):
        fast = _columnar(run, pa.Table.from_batches([batch]), line) if batch.num_rows else None
        if fast is not None:
            yield fast
        else:
            yield from _row_batches(events(_batch_rows(batch, line)), schema)
        line += batch.num_rows


def _batch(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    if schema is REF_LOGPROBS:
        columns = {
            "sample_id": pa.array([r["sample_id"] for r in rows], pa.string()),
            "ref_model": pa.array([r["ref_model"] for r in rows], pa.string()),
            "ref_logprobs": list_column([r["ref_logprobs"] for r in rows], pa.float32()),
            "source_uri": pa.array([r["source_uri"] for r in rows], pa.string()),
            "source_line": pa.array([r["source_line"] for r in rows], pa.int64()),
            "ingested_at": pa.array([r["ingested_at"] for r in rows], schema.field("ingested_at").type),
            "event_id": pa.array([r["event_id"] for r in rows], pa.string()),
        }
        return pa.RecordBatch.from_pydict(columns, schema=schema)
    return pa.RecordBatch.from_pylist(rows, schema=schema)
