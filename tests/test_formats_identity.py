"""Identity of records that carry no request ID (TGI, rollout dumps): identical records are distinct samples, and
reading the same content again, under any name, adds nothing."""

from __future__ import annotations

import gzip
import json
import shutil

import polars as pl

from prl.ingestion.traces import ingest
from tests.formats_helpers import FIXTURES

TGI = json.loads((FIXTURES / "tgi/tgi.jsonl").read_text().splitlines()[0])


def _line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False)


def _other_logprobs(record: dict) -> dict:
    record = json.loads(json.dumps(record))
    for token in record["details"]["tokens"]:
        token["logprob"] -= 0.5
    return record


def _sample_ids(store) -> list[str]:
    return pl.read_delta(store.table_uri("traces"))["sample_id"].to_list()


def test_identical_records_and_records_differing_only_in_logprobs_are_distinct(store, tmp_path):
    path = tmp_path / "tgi.jsonl"
    path.write_text("\n".join([_line(TGI), _line(TGI), _line(_other_logprobs(TGI))]) + "\n")
    result = ingest([str(path)], store)
    # three records of two sequences each (main + best_of): six samples, none lost as a duplicate
    assert (result.samples, result.already_present, result.quarantined) == (6, 0, {})
    assert len(set(_sample_ids(store))) == 6


def test_rereading_renamed_grown_or_compressed_content_adds_nothing(store, tmp_path):
    log = tmp_path / "app.jsonl"
    log.write_text("\n".join([_line(TGI), _line(TGI)]) + "\n")
    assert ingest([str(log)], store).samples == 4
    size = log.stat().st_size
    with log.open("a") as f:  # the log grows by one more identical record
        f.write(_line(TGI) + "\n")
    grown = ingest([str(log)], store)  # read on from where the last run stopped, its line numbered 3
    assert (grown.samples, grown.already_present, grown.files[0].resumed_from) == (2, 0, size)
    rotated = tmp_path / "app.jsonl.1"  # rotation renames it; a later pass compresses it
    shutil.move(log, rotated)
    assert (ingest([str(rotated)], store).samples, ingest([str(rotated)], store).files[0].status) == (0, "unchanged")
    compressed = tmp_path / "app.jsonl.1.gz"
    compressed.write_bytes(gzip.compress(rotated.read_bytes()))
    again = ingest([str(compressed)], store)
    assert (again.samples, again.already_present) == (0, 6)
    assert len(_sample_ids(store)) == 6


def test_another_file_with_the_same_record_is_another_sample(store, tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(_line(TGI) + "\n")
    second.write_text(_line(_other_logprobs(TGI)) + "\n" + _line(TGI) + "\n")
    assert ingest([str(first), str(second)], store).samples == 6
