"""The plan scans of a build: one streaming pass over ``traces`` (and ``ref_logprobs``) at pinned versions that keeps
a few scalars per sample and spills the token columns, plus the latest reward and verdict per sample. A frontier's
build also reads the ``sample_id`` column of the traces files it scans first (:func:`source_sample_ids`: on S3,
requests for those column chunks), so that the side reads keep only the rows of those samples.

Every scan reads its table at the version the build pinned (``store.versions()``, read once). While the batches go
by, the token columns of every row not shipped before are appended in scan order to a
:class:`~prl.shards.spill.ScanSpill`, so token data is decoded once per build; with ``kl = "advantages"`` each
side's logprobs are also summed per row (:func:`side_sums`), so the batch mean log ratio rarely needs a second
read. A dry run spills nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from prl.numerics import heads
from prl.numerics import kl as klmod
from prl.runtime import release_free_memory
from prl.shards.frontier import TraceSource, relative_file, whole_snapshot
from prl.shards.options import ShardOptions
from prl.shards.spill import ScanSpill
from prl.store.tables import READAHEAD_FILES, Store
from prl.trajectory import KEY_COLUMNS
from prl.verdicts import SEVERITY, regrade

SCAN_BATCH_ROWS = 1024
"""Rows per scanned batch while spilling (eight times as many in a dry run, which keeps no token data)."""

RELEASE_EVERY = 8
"""A scan hands the pages its allocators hold free back to the OS every this many batches
(:func:`prl.runtime.release_free_memory`): the token buffers of each batch are freed between the few scalars
kept per row, and the free pages left between them would otherwise grow with the rows scanned. Every 8 rather
than 32 batches took the traces scan's peak at 400 k samples from 580–700 MB to 500–520 MB in the same build
time (a hand-back takes up to a few tens of milliseconds, eight batches about 0.4 s)."""


TRACES_READAHEAD_BATCHES = 1
"""How far the traces scan decodes ahead of the plan, in batches, and in files one (the file being read) on a
local store, :data:`~prl.store.tables.READAHEAD_FILES` on S3 (whose pre-buffered reads then overlap the next
file's requests): the scan's columns are decoded on Arrow's threads all the same, and the store's usual readahead
(4 batches, 2 files) let decoded batches pile up while the plan took each one: Arrow's pool held 108–291 MB at the
scan's peak at 400 k samples (64 MB of it the scan's own frame), 64–91 MB with these, in about the same build
time."""

HEAD_COLUMNS = ("topk_ids", "topk_logprobs")


_PLAN_TRACE_SCALARS = (
    "sample_id",
    "group_id",
    "policy_version",
    "policy_version_spans",
    "finish_reason",
    "temperature",
    "top_p",
    "top_k",
    "logprobs_mode",
)
"""Trace columns the plan keeps as they are, per sample."""

MERGE_KEYS = [c for c in KEY_COLUMNS if c not in _PLAN_TRACE_SCALARS]
"""Trace columns the plan adds with ``merge_turns``: the trajectory order keys (:mod:`prl.trajectory`)."""


def frame(table: pa.Table) -> pl.DataFrame:
    """``table`` as a polars DataFrame (one conversion)."""
    out = pl.from_arrow(table)
    assert isinstance(out, pl.DataFrame)
    return out


def one_chunk(frames: list[pa.Table]) -> pl.DataFrame:
    """The tables of ``frames`` (one per scanned batch, one schema; the list is emptied) as one polars frame of one
    chunk per column, made a column at a time: each column's batches are let go once it is combined into one
    Arrow chunk, which is let go once converted, so that the batches and the frame are never both held whole;
    the freed pages are handed back before the first column and after each one
    (:func:`prl.runtime.release_free_memory`), or the pages each column's batches leave would pile up until the
    allocators' delays run out. Left in chunks, the frame would be copied whole, into one chunk, by the first
    operation that adds a column of one chunk to it (the plan's joins)."""
    schema = frames[0].schema
    columns = []
    release_free_memory()  # what the scan freed since its last hand-back: not held beside the frame being made
    for name in schema.names:
        chunks = [chunk for table in frames for chunk in table.column(name).chunks]
        frames[:] = [table.drop_columns([name]) for table in frames]
        column: pa.ChunkedArray | pa.Array = pa.chunked_array(chunks, type=schema.field(name).type)
        del chunks
        if not pa.types.is_dictionary(column.type):  # (the batches' dictionaries differ: polars unifies them)
            try:
                column = column.combine_chunks()  # converted once, from one chunk: polars makes no copy to rechunk
            except pa.ArrowInvalid:  # a string column past 2 GiB (32-bit offsets): polars takes the chunks
                pass
        series = pl.from_arrow(column)
        del column
        assert isinstance(series, pl.Series)
        columns.append(series.rechunk().alias(name))
        del series
        release_free_memory()  # the column's batches (Arrow's pool, glibc's malloc): back before the next one
    frames.clear()
    return pl.DataFrame(columns)


def _lengths(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return pc.fill_null(pc.list_value_length(column), 0).cast(pa.int64())


def _rows_all(flags_T: np.ndarray, offsets_N1: np.ndarray) -> np.ndarray:
    """Per row of a flat bool array: are all its flags True (an empty row: True)."""
    lengths_N = np.diff(offsets_N1)
    out_N = np.ones(len(lengths_N), dtype=bool)
    nonempty_N = lengths_N > 0
    if nonempty_N.any():
        out_N[nonempty_N] = np.logical_and.reduceat(flags_T[: offsets_N1[-1]], offsets_N1[:-1][nonempty_N])
    return out_N


def side_sums(lists: pa.ListArray, masks: pa.ListArray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(sums_N, simple_N)`` of a batch's logprob lists: each row's float64 sum (:func:`prl.numerics.kl.segment_sum`) and
    whether every value of the row counts in a log ratio on its side alone: finite, not null, and inside the
    row's ``masks`` (a null mask covers the whole row)."""
    offsets_N1 = lists.offsets.to_numpy().astype(np.int64)
    values_T = lists.values.slice(int(offsets_N1[0]), int(offsets_N1[-1] - offsets_N1[0]))
    offsets_N1 -= offsets_N1[0]
    values_T = values_T.to_numpy(zero_copy_only=False)  # nulls → NaN
    simple_N = _rows_all(np.isfinite(values_T), offsets_N1)
    if masks is not None and masks.null_count < len(masks):
        mask_off = masks.offsets.to_numpy().astype(np.int64)
        mask_vals = masks.values.slice(int(mask_off[0]), int(mask_off[-1] - mask_off[0]))
        mask_T = pc.fill_null(mask_vals, False).to_numpy(zero_copy_only=False)
        simple_N &= _rows_all(mask_T, mask_off - mask_off[0]) | ~masks.is_valid().to_numpy(zero_copy_only=False)
    return klmod.segment_sum(values_T, offsets_N1), simple_N


def _spill_rows(
    spill: ScanSpill, batch: pa.RecordBatch, columns: list[str], first_row: int, exclude: pa.Array | None
) -> None:
    """Spill ``columns`` of the rows of ``batch`` (scan rows from ``first_row``) whose sample is not excluded."""
    rows = np.arange(first_row, first_row + batch.num_rows, dtype=np.int64)
    part = batch.select(columns)
    if exclude is not None and len(exclude):
        keep = pc.invert(pc.is_in(batch["sample_id"], value_set=exclude))
        if not pc.all(keep).as_py():
            part = part.filter(keep)
            rows = rows[keep.to_numpy(zero_copy_only=False)]
    spill.write(part, rows)


def _side_sums_wanted(options: ShardOptions, spill: ScanSpill | None) -> bool:
    """Whether the plan scans sum each side's logprobs per row: for KL into the advantages, in a real build (a dry
    run computes no KL)."""
    return options.kl == "advantages" and spill is not None


def _scanned(
    store: Store,
    name: str,
    columns: list[str],
    version: int | None,
    spill: ScanSpill | None,
    spill_columns: list[str],
    exclude: pa.Array | None,
    filter: ds.Expression | None = None,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(first scan row number, batch)`` of table ``name`` at ``version``; with ``spill``, ``spill_columns`` of
    every row whose sample is not in ``exclude`` are spilled as the batches go by."""
    row = 0
    batch_rows = SCAN_BATCH_ROWS if spill is not None else SCAN_BATCH_ROWS * 8
    batches = store.scan(name, columns=columns, filter=filter, batch_size=batch_rows, version=version)
    for i, batch in enumerate(batches):
        if spill is not None:
            _spill_rows(spill, batch, spill_columns, row, exclude)
        yield row, batch
        row += batch.num_rows
        if i % RELEASE_EVERY == RELEASE_EVERY - 1:
            release_free_memory()


def _scanned_files(
    source: TraceSource,
    columns: list[str],
    spill: ScanSpill | None,
    spill_columns: list[str],
    exclude: pa.Array | None,
    read: ds.ParquetFragmentScanOptions,
) -> Iterator[tuple[int, str, pa.RecordBatch]]:
    """``(first scan row number, data file path, batch)`` of each part of ``source`` in turn (its rows that pass
    the part's filter), read as ``read`` says (the store's :attr:`~prl.store.tables.Store.scan_options`); with
    ``spill``, as :func:`_scanned`."""
    row = seen = 0
    batch_rows = SCAN_BATCH_ROWS if spill is not None else SCAN_BATCH_ROWS * 8
    for dataset, flt in source.parts:
        scanner = dataset.scanner(
            columns=columns,
            filter=flt,
            batch_size=batch_rows,
            fragment_scan_options=read,
            batch_readahead=TRACES_READAHEAD_BATCHES,
            fragment_readahead=READAHEAD_FILES if read.pre_buffer else 1,
        )
        for tagged in scanner.scan_batches():
            batch = tagged.record_batch
            if not batch.num_rows:
                continue
            if spill is not None:
                _spill_rows(spill, batch, spill_columns, row, exclude)
            yield row, tagged.fragment.path, batch
            row += batch.num_rows
            seen += 1
            if seen % RELEASE_EVERY == 0:
                release_free_memory()


def source_sample_ids(source: TraceSource, read: ds.ParquetFragmentScanOptions) -> pa.Array:
    """The distinct ``sample_id`` values (large_string) of the rows of ``source``, its parts' filters applied: what
    the side reads keep rows of when a frontier's source is scanned. Only the ``sample_id`` column is read."""
    chunks = []
    for dataset, flt in source.parts:
        table = dataset.to_table(columns=["sample_id"], filter=flt, fragment_scan_options=read)
        chunks += table.column("sample_id").cast(pa.large_string()).chunks  # (64-bit offsets: no 2 GiB limit)
    return pc.unique(pa.chunked_array(chunks, type=pa.large_string()))


def trace_spill_columns(options: ShardOptions) -> list[str]:
    cols = ["prompt_token_ids", "completion_token_ids", "completion_logprobs", "completion_mask"]
    return cols + (list(HEAD_COLUMNS) if options.topk is not None else [])


def scan_traces(
    store: Store,
    version: int | None,
    options: ShardOptions,
    spill: ScanSpill | None = None,
    exclude: pa.Array | None = None,
    source: TraceSource | None = None,
) -> pl.DataFrame:
    """Per-sample scalars of every trace row of ``source`` (default: the whole table at ``version``), with its
    scan row number (``row``) and its data file (``_file``, relative to the table folder; categorical). With
    ``spill``, the token columns of every row whose ``sample_id`` is not in ``exclude`` are spilled as they are
    decoded."""
    columns = [*_PLAN_TRACE_SCALARS, "prompt_token_ids", "completion_token_ids", "completion_mask"]
    baseline = options.singleton_baseline
    if baseline not in ("batch", "none") and baseline not in columns:
        columns.append(baseline)
    if options.topk is not None:
        columns.append("topk_ids")
    merge_keys = MERGE_KEYS if options.merge_turns else []
    columns += [c for c in merge_keys if c not in columns]
    with_sums = _side_sums_wanted(options, spill)
    if with_sums:
        columns.append("completion_logprobs")
    spill_columns = trace_spill_columns(options)
    if spill is not None:
        columns += [c for c in spill_columns if c not in columns]
    frames = []
    if source is None:
        source = whole_snapshot(store, version) if version is not None else TraceSource([], whole=True)
    for row, path, batch in _scanned_files(source, columns, spill, spill_columns, exclude, store.scan_options):
        n = batch.num_rows
        completion_len = _lengths(batch["completion_token_ids"])
        has_mask = pc.is_valid(batch["completion_mask"])
        cols = {
            "row": pa.array(np.arange(row, row + n, dtype=np.int64)),
            "_file": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n, np.int32)), pa.array([relative_file(store, path)])
            ),
            **{c: batch[c] for c in _PLAN_TRACE_SCALARS},
            "prompt_len": _lengths(batch["prompt_token_ids"]),
            "completion_len": completion_len,
            "has_mask": has_mask,
            "mask_len": pc.if_else(has_mask, _lengths(batch["completion_mask"]), completion_len),
            **{c: batch[c] for c in merge_keys},
        }
        if baseline not in ("batch", "none"):
            cols["baseline_key"] = batch[baseline].cast(pa.string())
        if options.topk is not None:
            cols["head_width"] = pa.array(heads.min_head_width(batch["topk_ids"]))
        if with_sums:
            lp_sum, lp_simple = side_sums(batch["completion_logprobs"], batch["completion_mask"])
            cols["lp_sum"], cols["lp_simple"] = pa.array(lp_sum), pa.array(lp_simple)
        frames.append(pa.table(cols))  # one conversion to polars at the end, not one per batch
    if not frames:
        return pl.DataFrame()
    out = one_chunk(frames)
    release_free_memory()  # the batches' columns, freed as they were converted
    return out


_NULLS_PER_KEY = int(pa.__version__.split(".")[0]) >= 25
"""Whether pyarrow takes the null placement per sort key (from 25; earlier, one for all keys)."""


def _ascending_nulls_first(by: list[str]) -> dict[str, object]:
    """``sort_indices`` options: ``by`` ascending, nulls first (polars' default order)."""
    if _NULLS_PER_KEY:
        return {"sort_keys": [(k, "ascending", "at_start") for k in by]}
    return {"sort_keys": [(k, "ascending") for k in by], "null_placement": "at_start"}


def last_rows(rows: pa.Table, by: list[str], run: list[str]) -> pa.Array:
    """Indices (uint64) of the last row of each run of equal ``run`` columns once ``rows`` are in ``by`` order
    (ascending, nulls first; stable: rows that tie on every key stay in their order), in that order: one per
    distinct ``run``. Arrow orders the key columns as they are (no copy of the table, no row encoding of the
    keys)."""
    order = pc.sort_indices(rows.select(by), **_ascending_nulls_first(by))
    n = len(order)
    if n == 0:
        return order
    same_next: pa.Array | None = None
    for name in run:
        column = rows.column(name).take(order)
        same = pc.fill_null(pc.equal(column.slice(0, n - 1), column.slice(1)), False)
        same_next = same if same_next is None else pc.and_(same_next, same)
        del column
    assert same_next is not None
    return pc.filter(order, pa.concat_arrays([pc.invert(same_next).combine_chunks(), pa.array([True])]))


def last_of_runs(rows: pa.Table, by: list[str], run: list[str], keep: list[str]) -> pl.DataFrame:
    """The ``keep`` columns of :func:`last_rows`, as polars: only the rows kept are gathered."""
    return frame(rows.select(keep).take(last_rows(rows, by, run)))


def _wide(latest: pa.Table, names: list[str]) -> pl.DataFrame:
    """``sample_id`` and ``r::<name>`` per name from ``latest`` (sample_id, name, value: one row per sample and
    name, in sample order): each row's sample is its run of ``sample_id``, so no join is needed."""
    ids = latest.column("sample_id").combine_chunks()
    n = len(ids)
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    sample_L = np.cumsum(starts) - 1  # the wide row of each latest row
    columns = {"sample_id": ids.filter(pa.array(starts))}
    values = latest.column("value").combine_chunks().cast(pa.float64())
    for name in names:
        at = np.flatnonzero(pc.equal(latest.column("name"), name).to_numpy(zero_copy_only=False))
        taken = values.take(pa.array(at))
        present = np.zeros(int(starts.sum()), dtype=bool)  # null: no such row (or a null value)
        present[sample_L[at]] = taken.is_valid().to_numpy(zero_copy_only=False)
        column = np.zeros(len(present))
        column[sample_L[at]] = taken.to_numpy(zero_copy_only=False)
        columns[f"r::{name}"] = pa.array(column, mask=~present)
    return frame(pa.table(columns))


def _only(flt: ds.Expression | None, only: pa.Array | None) -> ds.Expression | None:
    """``flt`` and, with ``only``, "the row's sample is one of ``only``"."""
    if only is None:
        return flt
    among = pc.field("sample_id").isin(only)
    return among if flt is None else flt & among


def latest_rewards(store: Store, version: int | None, names: list[str], only: pa.Array | None = None) -> pl.DataFrame:
    """``sample_id`` + one float64 column ``r::<name>`` per component (latest event per sample and name), of the
    samples ``only`` names (default: every sample)."""
    cols = ["sample_id", "name", "value", "created_at", "ingested_at", "source_uri", "source_line"]
    out = pl.DataFrame({"sample_id": pl.Series([], dtype=pl.String)})
    if version is None:
        return out.with_columns([pl.lit(None, dtype=pl.Float64).alias(f"r::{n}") for n in names])
    table = store.read("rewards", columns=cols, filter=_only(pc.field("name").isin(names), only), version=version)
    by = ["sample_id", "name", "created_at", "ingested_at", "source_uri", "source_line"]
    latest = table.select(["sample_id", "name", "value"]).take(last_rows(table, by, ["sample_id", "name"]))
    del table
    return _wide(latest, names)


def latest_verdicts(
    store: Store,
    version: int | None,
    fingerprint: str | None,
    only: pa.Array | None = None,
    prefix: bool = True,
    reasons: bool = False,
) -> pl.DataFrame:
    """``sample_id``, ``verdict``, with ``prefix`` ``prefix_status`` (what merging turns reads) and with
    ``reasons`` the ``reasons`` list: the latest check per sample (``fingerprint``'s only, when given), of the
    samples ``only`` names (default: every sample). ``verdict`` is the latest check's reasons graded by today's
    reason table (:func:`prl.verdicts.regrade`), so that checks written before a reason changed verdict
    are read as graded now."""
    keep = ["sample_id", "verdict", "prefix_status"] if prefix else ["sample_id", "verdict"]
    if reasons:
        keep.append("reasons")
    if version is None:
        return pl.DataFrame(schema={c: (pl.List(pl.String) if c == "reasons" else pl.String) for c in keep})
    flt = pc.field("tokenizer_fingerprint") == fingerprint if fingerprint else None
    read = [*keep, "reasons"] if not reasons else keep
    table = store.read(
        "checks",
        columns=[*read, "checked_at", "tokenizer_fingerprint"],
        filter=_only(flt, only),
        version=version,
    )
    severity = tuple(SEVERITY)
    sev = pc.fill_null(pc.index_in(table["verdict"], value_set=pa.array(severity)), len(severity))
    table = table.append_column("_sev", sev)  # ok, note, warn, drift, invalid: 0-4, anything else 5
    by = ["sample_id", "checked_at", "_sev", "tokenizer_fingerprint"]
    latest = last_of_runs(table, by, ["sample_id"], [*keep, "reasons"] if not reasons else keep)
    graded = regrade(latest.get_column("verdict").to_arrow(), latest.get_column("reasons").to_arrow())
    latest = latest.with_columns(pl.Series("verdict", graded))
    return latest if reasons else latest.drop("reasons")


def _ref_filter(options: ShardOptions) -> ds.Expression | None:
    return pc.field("ref_model") == options.ref_model if options.ref_model else None


def scan_refs(
    store: Store,
    version: int | None,
    options: ShardOptions,
    spill: ScanSpill | None = None,
    exclude: pa.Array | None = None,
    only: pa.Array | None = None,
) -> pl.DataFrame:
    """The winning reference row per sample (latest ingest) with its scan row number (``ref_row``) and length, of
    the samples ``only`` names (default: every sample). With ``spill``, ``ref_logprobs`` of every such row whose
    ``sample_id`` is not in ``exclude`` is spilled."""
    frames = []
    with_sums = _side_sums_wanted(options, spill)
    columns = ["sample_id", "ingested_at", "source_uri", "source_line", "ref_logprobs"]
    spilled = ["ref_logprobs"]
    flt = _only(_ref_filter(options), only)
    for row, batch in _scanned(store, "ref_logprobs", columns, version, spill, spilled, exclude, flt):
        n = batch.num_rows
        cols = {
            "ref_row": pa.array(np.arange(row, row + n, dtype=np.int64)),
            **{c: batch[c] for c in columns[:-1]},  # sample_id and what picks the latest row
            "ref_len": _lengths(batch["ref_logprobs"]),
        }
        if with_sums:
            ref_sum, ref_simple = side_sums(batch["ref_logprobs"])
            cols["ref_sum"], cols["ref_simple"] = pa.array(ref_sum), pa.array(ref_simple)
        frames.append(pa.table(cols))
    keep = ["sample_id", "ref_row", "ref_len"] + (["ref_sum", "ref_simple"] if with_sums else [])
    if not frames:
        empty = {"sample_id": pl.String, "ref_row": pl.Int64, "ref_len": pl.Int64, "ref_sum": pl.Float64}
        return pl.DataFrame(schema={c: empty.get(c, pl.Boolean) for c in keep})
    rows = pa.concat_tables(frames)
    frames.clear()
    # ties on the keys are broken by scan row (``ref_row``, ascending), which the stable order keeps
    return last_of_runs(rows, ["sample_id", "ingested_at", "source_uri", "source_line"], ["sample_id"], keep)


__all__ = [
    "HEAD_COLUMNS",
    "SCAN_BATCH_ROWS",
    "latest_rewards",
    "latest_verdicts",
    "scan_refs",
    "scan_traces",
    "side_sums",
    "source_sample_ids",
    "trace_spill_columns",
]
