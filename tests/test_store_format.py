"""The store's format version (prl.store.format): a new store records it, a store of another format is refused
with exit 2 by every command that opens it, and ``prl maintain --upgrade`` brings a format-1 store (no marker,
tables as an older prl wrote them) to the current format, once."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from prl.errors import UsageError
from prl.ingestion.side_tables import ingest_side_table
from prl.maintain import TableUpgrade, upgrade
from prl.schema import REF_LOGPROBS, REWARDS
from prl.store.format import MARKER, STORE_FORMAT, store_format
from prl.store.index import EVENT_INDEXES
from prl.store.resolve import open_store
from prl.store.tables import TABLE_PROPERTIES, Store
from tests.pipeline_helpers import GrowingInput, invoke_json
from tests.s3_server import moto_endpoint, s3  # noqa: F401

STAMP = pa.scalar(1_790_000_000_000, pa.timestamp("ms", tz="UTC"))
LATER = pa.scalar(1_790_000_500_000, pa.timestamp("ms", tz="UTC"))
OLD_REWARDS = pa.schema([f for f in REWARDS if f.name != "event_id"])
"""The rewards table as an older prl created it."""


def _ingested(data: GrowingInput, store: Path) -> None:
    assert invoke_json(["ingest", str(data.trace_path(0)), "--store", str(store)])[0] == 0
    assert invoke_json(["ingest", "--kind", "rewards", str(data.rewards_path), "--store", str(store)])[0] == 0


def _as_format_1(store: Path) -> None:
    """What an older prl left: rewards written without ``event_id`` nor table properties, no event index, no
    marker."""
    rows = pl.read_delta(str(store / "rewards")).to_arrow().drop_columns(["event_id"])
    shutil.rmtree(store / "rewards")
    shutil.rmtree(store / "_index" / "rewards_events")
    write_deltalake(str(store / "rewards"), rows.cast(OLD_REWARDS))
    (store / MARKER).unlink()


def _event_ids(store: Path) -> list[tuple[str, str]]:
    return sorted(pl.read_delta(str(store / "rewards")).select("sample_id", "event_id").rows())


def _shards(summary: dict) -> tuple:
    return summary["rows"], summary["drops"], [(s["rows"], s["tokens"], s["sha256"]) for s in summary["shards"]]


def test_a_new_store_records_the_current_format(store, tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"sample_id": "a#0", "reward": 1.0}) + "\n")
    assert store_format(store) is None
    ingest_side_table([str(path)], store, kind="rewards")
    assert (Path(store.uri) / MARKER).read_bytes() == b'{"format": 2}\n'
    assert (STORE_FORMAT, store_format(store)) == (2, 2)
    assert [p.name for p in Path(store.uri).iterdir() if p.name.startswith(".")] == []  # no staged marker left


def test_a_format_1_store_is_refused_until_upgraded_then_works_as_a_fresh_one(tmp_path, tokenizer_dir):
    fresh, old = tmp_path / "fresh", tmp_path / "old"
    data = GrowingInput(tmp_path / "in", files=1, seed=5, bad_every=1000)
    data.grow(24)  # one malformed line in 25: under the 5 % quarantine limit
    _ingested(data, fresh)
    _ingested(data, old)
    _as_format_1(old)
    hint = f"store {old} is of format 1, written by an older prl; this prl uses format 2: upgrade it once with "
    hint += f"`prl maintain --upgrade --store {old}`"
    commands = [
        ["ingest", str(data.trace_path(0)), "--store", str(old)],
        ["ingest", "--kind", "rewards", str(data.rewards_path), "--store", str(old)],
        ["check-tokens", "--store", str(old), "--tokenizer", tokenizer_dir],
        ["build-shards", "--store", str(old), "--out", str(tmp_path / "out-old"), "--set", "require_checks=false"],
        ["maintain", "--store", str(old)],
        ["inspect", str(old)],
    ]
    for args in commands:
        code, summary = invoke_json(args)
        assert (code, summary["error"]) == (2, hint), args

    code, summary = invoke_json(["maintain", "--store", str(old), "--upgrade", "--dry-run"])
    assert (code, summary["format_before"], summary["format_after"], summary["dry_run"]) == (0, 1, 1, True)
    assert not (old / MARKER).exists()
    code, summary = invoke_json(["maintain", "--store", str(old), "--upgrade"])
    assert (code, summary["command"], summary["upgrade"]) == (0, "maintain", True)
    assert (summary["format_before"], summary["format_after"]) == (1, 2)
    by_table = {t["table"]: t for t in summary["tables"]}
    assert sorted(by_table) == ["_index/traces_keys", "quarantine", "rewards", "traces"]
    assert by_table["rewards"] == {
        "table": "rewards",
        "columns_added": ["event_id"],
        "properties_set": True,
        "event_ids_filled": 50,
        "index_rebuilt": True,
    }
    assert by_table["traces"] == asdict(TableUpgrade("traces"))
    assert _event_ids(old) == _event_ids(fresh)  # the ids an ingest gives the same events
    assert DeltaTable(str(old / "rewards")).metadata().configuration == TABLE_PROPERTIES
    assert (old / MARKER).read_bytes() == b'{"format": 2}\n'

    assert len(data.good) == 50
    # the old store's ledger went with its rewritten table: the file is read again, its events known by their ids
    for store, expected in ((old, (0, 50, 0)), (fresh, (0, 0, 1))):
        again = invoke_json(["ingest", "--kind", "rewards", str(data.rewards_path), "--store", str(store)])[1]
        assert (again["rows"], again["already_present"], again["unchanged_files"]) == expected, store.name
    results = {}
    for store in (old, fresh):
        checked = invoke_json(["check-tokens", "--store", str(store), "--tokenizer", tokenizer_dir])[1]
        out = tmp_path / f"out-{store.name}"
        built = invoke_json(["build-shards", "--store", str(store), "--out", str(out), "--set", "require_checks=false"])
        results[store.name] = (checked["verdicts"], checked["reasons"], _shards(built[1]))
    assert results["old"] == results["fresh"]
    assert results["old"][0] == {"drift": 29, "invalid": 0, "note": 8, "ok": 13, "warn": 0}

    code, twice = invoke_json(["maintain", "--store", str(old), "--upgrade"])
    assert (code, twice["format_before"], twice["format_after"], twice["tables"]) == (0, 2, 2, [])


def test_legacy_reward_rows_get_the_ids_an_ingest_gives_and_a_grown_file_adds_only_its_new_lines(store, tmp_path):
    """Rows stored without ``event_id``: stamped ones (created_at from the source) and one without a time of its
    own (created_at = ingested_at), two identical events of one file (its 0th and 1st occurrence)."""
    path = tmp_path / "r.jsonl"
    lines = [
        {"sample_id": "a#0", "name": "reward", "value": 1.0, "created_at": 1_790_000_000},
        {"sample_id": "b#0", "name": "reward", "value": 0.5},
        {"sample_id": "a#0", "name": "reward", "value": 1.0, "created_at": 1_790_000_000},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    reference = Store(str(tmp_path / "reference"))
    assert ingest_side_table([str(path)], reference, kind="rewards").rows == 3
    old_rows = {
        "sample_id": ["a#0", "b#0", "a#0"],
        "name": ["reward"] * 3,
        "value": [1.0, 0.5, 1.0],
        "created_at": [STAMP, LATER, STAMP],
        "source_uri": [str(path)] * 3,
        "source_line": [1, 2, 3],
        "ingested_at": [LATER] * 3,
    }
    write_deltalake(store.table_uri("rewards"), pa.table(old_rows, schema=OLD_REWARDS))
    with pytest.raises(UsageError, match="prl maintain --upgrade"):
        ingest_side_table([str(path)], store, kind="rewards")

    result = upgrade(store)
    assert [(t.table, t.columns_added, t.event_ids_filled) for t in result.tables] == [("rewards", ["event_id"], 3)]
    ids = pl.read_delta(store.table_uri("rewards")).sort("source_line")["event_id"].to_list()
    expected = pl.read_delta(reference.table_uri("rewards")).sort("source_line")["event_id"].to_list()
    assert ids == expected and len(set(ids)) == 3
    index = pl.read_delta(store.table_uri(EVENT_INDEXES["rewards"].index_table))
    assert sorted(index["event_id"].to_list()) == sorted(expected)

    with open(path, "a") as fh:
        fh.write(json.dumps({"sample_id": "c#0", "name": "reward", "value": 0.0}) + "\n")
    grown = ingest_side_table([str(path)], store, kind="rewards")
    assert (grown.rows, grown.already_present) == (1, 3)
    assert sorted(pl.read_delta(store.table_uri("rewards"))["sample_id"].to_list()) == ["a#0", "a#0", "b#0", "c#0"]


def test_legacy_reference_rows_get_the_ids_an_ingest_gives(store, tmp_path):
    path = tmp_path / "ref.jsonl"
    rows = [("a#0", [-0.5, -0.25]), ("b#0", [-1.0])]
    path.write_text(
        "".join(json.dumps({"sample_id": s, "ref_model": "base", "ref_logprobs": v}) + "\n" for s, v in rows)
    )
    reference = Store(str(tmp_path / "reference"))
    assert ingest_side_table([str(path)], reference, kind="ref").rows == 2
    old_rows = {
        "sample_id": ["a#0", "b#0"],
        "ref_model": ["base", "base"],
        "ref_logprobs": [[-0.5, -0.25], [-1.0]],
        "source_uri": [str(path)] * 2,
        "source_line": [1, 2],
        "ingested_at": [LATER] * 2,
    }
    old_schema = pa.schema([f for f in REF_LOGPROBS if f.name != "event_id"])
    write_deltalake(store.table_uri("ref_logprobs"), pa.table(old_rows, schema=old_schema))

    (done,) = upgrade(store).tables
    assert (done.table, done.columns_added, done.event_ids_filled, done.index_rebuilt) == (
        "ref_logprobs",
        ["event_id"],
        2,
        True,
    )
    ids = pl.read_delta(store.table_uri("ref_logprobs")).sort("source_line")["event_id"].to_list()
    assert ids == pl.read_delta(reference.table_uri("ref_logprobs")).sort("source_line")["event_id"].to_list()
    copy = tmp_path / "copy.jsonl"
    shutil.copy(path, copy)
    again = ingest_side_table([str(copy)], store, kind="ref")
    assert (again.rows, again.already_present) == (0, 2)


def test_an_upgrade_killed_before_its_marker_is_finished_by_the_next_one(store, tmp_path, monkeypatch):
    old_rows = {
        "sample_id": ["a#0"],
        "name": ["reward"],
        "value": [1.0],
        "created_at": [STAMP],
        "source_uri": [str(tmp_path / "r.jsonl")],
        "source_line": [1],
        "ingested_at": [LATER],
    }
    write_deltalake(store.table_uri("rewards"), pa.table(old_rows, schema=OLD_REWARDS))
    from prl import maintain as maintain_module

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(maintain_module, "write_marker", killed)
    with pytest.raises(KeyboardInterrupt):
        upgrade(store)
    monkeypatch.undo()
    assert store_format(store) == 1
    with pytest.raises(UsageError, match="of format 1"):
        open_store(store)
    finished = upgrade(store)
    assert (finished.format_before, finished.format_after) == (1, 2)
    assert [(t.columns_added, t.properties_set, t.event_ids_filled) for t in finished.tables] == [([], False, 0)]
    assert pl.read_delta(store.table_uri("rewards"))["event_id"].null_count() == 0
    assert open_store(store) is store


def test_a_store_of_a_newer_format_or_a_damaged_marker_is_refused(store, tmp_path, tokenizer_dir):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"sample_id": "a#0", "reward": 1.0}) + "\n")
    ingest_side_table([str(path)], store, kind="rewards")
    marker = Path(store.uri) / MARKER
    marker.write_text('{"format": 3}\n')
    newer = (
        f"store {store.uri} is of format 3, written by a newer prl; this prl uses format 2: use that prl (or a "
        "newer one) with it"
    )
    for args in (
        ["ingest", "--kind", "rewards", str(path), "--store", store.uri],
        ["check-tokens", "--store", store.uri, "--tokenizer", tokenizer_dir],
        ["maintain", "--store", store.uri, "--upgrade"],
    ):
        assert invoke_json(args)[1]["error"] == newer, args
    marker.write_text("format 2")
    code, summary = invoke_json(["inspect", store.uri])
    damaged = f"store {store.uri}: {MARKER} is damaged (not {{\"format\": <version>}}): b'format 2'"
    assert (code, summary["error"]) == (2, damaged)


def test_a_first_ingest_killed_after_the_marker_leaves_a_store_it_can_start_again(tmp_path, tokenizer_dir):
    """The marker comes before the first table: a folder holding only it (and locks) is prl's own."""
    root = tmp_path / "store"
    root.mkdir()
    (root / MARKER).write_text('{"format": 2}\n')
    (root / "_locks").mkdir()
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"sample_id": "a#0", "reward": 1.0}) + "\n")
    code, summary = invoke_json(["check-tokens", "--store", str(root), "--tokenizer", tokenizer_dir])
    assert code == 2 and "it holds no prl table" in summary["error"]
    code, summary = invoke_json(["ingest", "--kind", "rewards", str(path), "--store", str(root)])
    assert (code, summary["rows"]) == (0, 1)


def test_an_s3_store_of_format_1_is_refused_then_upgraded(s3, tmp_path):  # noqa: F811
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"sample_id": "a#0", "reward": 1.0}) + "\n")
    url = s3.url("store")
    assert invoke_json(["ingest", "--kind", "rewards", str(path), "--store", url])[0] == 0
    assert json.loads(s3.client.get_object(Bucket=s3.bucket, Key=f"store/{MARKER}")["Body"].read()) == {"format": 2}
    s3.client.delete_object(Bucket=s3.bucket, Key=f"store/{MARKER}")
    code, summary = invoke_json(["ingest", "--kind", "rewards", str(path), "--store", url])
    assert (code, summary["error"].endswith(f"`prl maintain --upgrade --store {url}`")) == (2, True)
    code, summary = invoke_json(["maintain", "--store", url, "--upgrade"])
    assert (code, summary["format_before"], summary["format_after"]) == (0, 1, 2)
    assert [t["event_ids_filled"] for t in summary["tables"] if t["table"] == "rewards"] == [0]
    code, summary = invoke_json(["ingest", "--kind", "rewards", str(path), "--store", url])
    assert (code, summary["unchanged_files"]) == (0, 1)
    assert invoke_json(["maintain", "--store", url, "--upgrade"])[1]["tables"] == []
