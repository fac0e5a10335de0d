"""How an ingest commit group is cut into runs of files for other engines' workers, and how their reads are
folded back in file order (:mod:`prl.ingestion.remote`), without a cluster: the reads are made here."""

from __future__ import annotations

import pytest

from prl.formats.base import ParseOptions
from prl.ingestion.remote import IngestJob, merged, read_unit
from prl.io.sources import SourceFile, scan
from prl.store.index import SampleIndex
from prl.store.tables import Store
from tests.conftest import write_lines
from tests.records import vllm_completion


def _job(files: list[SourceFile], store: str = "s") -> IngestJob:
    return IngestJob(store, files, "auto", ParseOptions(), 1 << 20, 0.0, {}, dry_run=True)


def test_units_are_consecutive_runs_of_about_equal_bytes():
    job = _job([SourceFile(f"f{i}", size, 0) for i, size in enumerate([10, 10, 10, 70, 1, 1])])
    assert job.units(1) == [(0, 6)]
    assert job.units(2) == [(0, 3), (3, 6)]
    assert job.units(3) == [(0, 3), (3, 4), (4, 6)]
    assert job.units(6) == [(i, i + 1) for i in range(6)]
    assert job.units(9) == [(i, i + 1) for i in range(6)]


def test_runs_read_apart_fold_into_the_read_of_the_whole_group(tmp_path):
    """The second run repeats a sample of the first: folded, it is read again after the first and counted as
    already present, exactly as one read of both files counts it; a run missing or read twice is refused."""
    first = [vllm_completion(f"c{k}", [1, 2], [7, 9 + k], [-0.5, -4.0]) for k in range(3)]
    write_lines(tmp_path / "in" / "a.jsonl", first)
    write_lines(tmp_path / "in" / "b.jsonl", [first[1], vllm_completion("d", [3], [4], [-1.0])])
    store = Store(str(tmp_path / "store"))
    job = _job(scan([str(tmp_path / "in")]).files, store.uri)
    index = SampleIndex(store, write=False)
    whole = read_unit(job, 0, 2, index)
    apart = [read_unit(job, lo, hi, index) for lo, hi in job.units(2)]
    assert [r.seen.keys() & {"c1#0"} for r in apart] == [{"c1#0"}, {"c1#0"}]  # each run alone keeps c1
    folded = merged(job, reversed(apart), index)
    assert (folded.lo, folded.hi, folded.seen) == (0, 2, whole.seen)
    assert [(r.samples, r.already_present) for r in folded.reports] == [(3, 0), (1, 1)]
    assert folded.reports == whole.reports and folded.state.ledger == whole.state.ledger
    with pytest.raises(RuntimeError, match="do not cover the group's 2 files once"):
        merged(job, apart[:1], index)
    with pytest.raises(RuntimeError, match="do not cover"):
        merged(job, [apart[0], apart[0], apart[1]], index)
