"""A plain log that grows between runs is read on from where the last run stopped, and the tables are the ones a
single read of the final file gives: the same sample IDs (records without a request ID are salted by their line
number and the file's first record), the same rows, the same quarantine rows. A rotated, truncated or rewritten
file, a compressed one, another ``--format`` or a ledger entry without a resume point mean a read from the
start, and lose nothing."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prl.ingestion.resume import ResumePoint, app_id
from prl.ingestion.traces import ingest
from prl.io.prefix import PrefixDigest, PrefixWindow
from prl.store.tables import Store
from tests.delta_log import commit_infos
from tests.records import vllm_chat
from tests.s3_server import moto_endpoint, s3  # noqa: F401

DATA = Path(__file__).parent.parent / "sample_data" / "traces"
TGI = (DATA / "tgi_generate.jsonl").read_bytes()  # request IDs derived from content, salted by position
SLIME = (DATA / "slime_rollouts.jsonl").read_bytes()
VERL = (DATA / "verl_rollouts.jsonl").read_bytes()  # no finish reason: quarantined
CHAT = b"".join(json.dumps(vllm_chat(f"grow{i}", [i + 1, 7], [([i + 2], [-1.0])])).encode() + b"\n" for i in range(3))
LOG = TGI + SLIME + b"{not json\n\n" + TGI + CHAT + VERL  # TGI twice: byte-identical records, other positions
"""A mixed log of 20 lines (18 records, a malformed line, a blank one), 41 KiB."""


def tables(store: Store) -> tuple[list[dict], list[dict]]:
    """traces and quarantine rows (without their ingest times), in a fixed order."""
    options = store.options or None
    read = pl.read_delta(store.table_uri("traces"), storage_options=options)
    traces = read.drop("ingested_at").sort("sample_id").to_dicts()
    if store.version("quarantine") is None:
        return traces, []
    quarantine = pl.read_delta(store.table_uri("quarantine"), storage_options=options)
    quarantine = quarantine.drop("quarantined_at").sort("quarantine_id")
    return traces, quarantine.to_dicts()


def entry(store: Store) -> dict:
    """The ledger entry of the newest traces commit that has one (an empty dict before any)."""
    infos = [] if store.version("traces") is None else commit_infos(store, "traces")
    found = next((info["prl.sources"] for info in infos if "prl.sources" in info), [{}])
    assert len(found) == 1
    return found[0]


def grow(path: Path, content: bytes, cuts: list[int], store: Store) -> list[tuple[int, int]]:
    """Write ``content`` cut by cut (appending), ingesting after each; (resumed_from, bytes_read) per run, each
    checked against the ledger entry of the run before."""
    runs: list[tuple[int, int]] = []
    written, consumed = 0, 0
    path.write_bytes(b"")
    for cut in [*cuts, len(content)]:
        with open(path, "ab") as fh:
            fh.write(content[written:cut])
        written = cut
        result = ingest([str(path)], store, max_quarantine_rate=None)
        (report,) = result.files
        runs.append((report.resumed_from, report.bytes_read))
        assert report.resumed_from in (0, consumed)
        assert report.bytes_read == result.bytes_read == cut - report.resumed_from
        consumed = entry(store).get("bytes_consumed", 0)
    return runs


def once(path: Path, content: bytes, store: Store) -> tuple[list[dict], list[dict]]:
    path.write_bytes(content)
    ingest([str(path)], store, max_quarantine_rate=None)
    return tables(store)


def test_a_log_grown_over_runs_gives_the_tables_of_one_read(tmp_path):
    path = tmp_path / "live.jsonl"
    # a partial first line (nothing consumed), a line boundary, mid-line, after the blank line, mid-line
    lines = LOG.split(b"\n")
    ends = [sum(len(line) + 1 for line in lines[:n]) for n in range(len(lines))]
    cuts = [100, ends[3], ends[5] + 50, ends[9], ends[12] + 7]
    grown = Store(str(tmp_path / "grown"))
    runs = grow(path, LOG, cuts, grown)
    assert runs == [
        (0, 100),
        (0, ends[3]),  # nothing consumed before: from the start
        (ends[3], ends[5] + 50 - ends[3]),
        (ends[5], ends[9] - ends[5]),  # the held half line is read again, whole
        (ends[9], ends[12] + 7 - ends[9]),
        (ends[12], len(LOG) - ends[12]),
    ]
    ledger = entry(grown)
    assert (ledger["bytes_consumed"], ledger["complete"], ledger["read_from"]) == (len(LOG), True, ends[12])
    assert ledger["resume"]["offset"] == len(LOG) and ledger["resume"]["lines"] == LOG.count(b"\n")
    traces, quarantine = tables(grown)
    assert (len(traces), len({r["sample_id"] for r in traces})) == (13, 13)  # 6 TGI (3 twice), 4 slime, 3 chat
    assert sorted(q["reason"] for q in quarantine) == ["malformed_json"] + ["missing_finish_reason"] * 3
    assert (traces, quarantine) == once(tmp_path / "live.jsonl", LOG, Store(str(tmp_path / "once")))


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(cuts=st.lists(st.integers(1, len(LOG) - 1), min_size=1, max_size=3, unique=True).map(sorted))
def test_any_cut_points_give_the_tables_of_one_read(cuts):
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "live.jsonl"
        grow(path, LOG, cuts, Store(f"{work}/grown"))
        grown = tables(Store(f"{work}/grown"))
        assert grown == once(path, LOG, Store(f"{work}/once"))


SSE = (DATA / "vllm_chat_stream.sse").read_bytes()
_END = SSE.find(b"data: [DONE]\n\n") + len(b"data: [DONE]\n\n")
THIRD = SSE[_END:].replace(b"chatcmpl-aae1480f80a65a0478f20f3fce4dd65a", b"chatcmpl-3333333333333333333333333333333d")
CAPTURE = SSE + THIRD  # three streams, the second and third of two choices


def _messy() -> bytes:
    """The capture with a comment and a line that is no SSE field between streams, and a fourth stream (another
    id) holding a chunk that is not JSON: framed by the line framer, quarantined as malformed_sse / _json."""
    fourth = THIRD.replace(b"chatcmpl-3333333333333333333333333333333d", b"chatcmpl-4444444444444444444444444444444d")
    at = fourth.find(b"data: {", fourth.find(b"data: {") + 1)
    fourth = fourth[:at] + b"data: {broken\n\n" + fourth[at:]
    return SSE[:_END] + b": keep-alive\n\nnot sse at all\n\n" + SSE[_END:] + fourth + THIRD


MESSY = _messy()


def test_a_growing_sse_capture_continues_at_stream_boundaries(tmp_path):
    for layout in ("servers", "crlf"):

        def form(data: bytes, layout: str = layout) -> bytes:
            return data.replace(b"\n", b"\r\n") if layout == "crlf" else data

        content = form(CAPTURE)
        second = content.find(b"data: {", len(content) // 3)  # inside the second stream
        third_done = content.rfind(b"data: [DONE]")
        cuts = [second + 30, content.find(b"\n", second + 200) + 1, third_done, third_done + 5]
        path = tmp_path / f"{layout}.sse"
        grown = Store(str(tmp_path / f"grown-{layout}"))
        runs = grow(path, content, cuts, grown)
        first, second_stream, third_stream = 0, len(form(SSE[:_END])), len(form(SSE))
        assert [start for start, _ in runs] == [first, second_stream, second_stream, third_stream, third_stream]
        assert entry(grown)["complete"] is True
        traces, quarantine = tables(grown)
        assert [r["sample_id"] for r in traces] == [
            "chatcmpl-0ba70b30b73b6b0f5d789616dafd9053#0",
            "chatcmpl-3333333333333333333333333333333d#0",
            "chatcmpl-3333333333333333333333333333333d#1",
            "chatcmpl-aae1480f80a65a0478f20f3fce4dd65a#0",
            "chatcmpl-aae1480f80a65a0478f20f3fce4dd65a#1",
        ]
        assert (traces, quarantine) == once(path, content, Store(str(tmp_path / f"once-{layout}"))), layout


@settings(max_examples=10, deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(MESSY) - 1), min_size=1, max_size=3, unique=True).map(sorted),
    crlf=st.booleans(),
)
def test_any_cut_points_of_an_sse_capture_give_the_tables_of_one_read(cuts, crlf):
    content = MESSY.replace(b"\n", b"\r\n") if crlf else MESSY
    cuts = [cut * len(content) // len(MESSY) for cut in cuts]
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "live.sse"
        grow(path, content, cuts, Store(f"{work}/grown"))
        grown = tables(Store(f"{work}/grown"))
        assert grown == once(path, content, Store(f"{work}/once"))
        assert sorted(q["reason"] for q in grown[1]) == ["malformed_json", "malformed_sse"]


def big(rid: str, seed: int) -> bytes:
    """A chat record of about 5 KiB: more than a digest block."""
    return json.dumps(vllm_chat(rid, list(range(seed, seed + 900)), [([seed + 2], [-1.0])])).encode() + b"\n"


def ids(store: Store) -> list[str]:
    return sorted(pl.read_delta(store.table_uri("traces"))["sample_id"].to_list())


def test_a_rotated_file_is_read_from_its_start(store, tmp_path):
    path = tmp_path / "server.log"
    path.write_bytes(big("a0", 1) + big("a1", 2))
    ingest([str(path)], store)
    path.write_bytes(big("b0", 3) + big("b1", 4) + big("b2", 5))  # same name, new content, longer
    result = ingest([str(path)], store)
    assert (result.files[0].resumed_from, result.samples, result.already_present) == (0, 3, 0)
    assert ids(store) == ["a0#0", "a1#0", "b0#0", "b1#0", "b2#0"]


def test_a_truncated_file_is_read_from_its_start_also_once_it_is_longer_again(store, tmp_path):
    path = tmp_path / "server.log"
    path.write_bytes(big("t0", 1) + big("t1", 2) + big("t2", 3))
    ingest([str(path)], store)
    path.write_bytes(big("t0", 1))  # shorter than what was consumed
    result = ingest([str(path)], store)
    assert (result.files[0].resumed_from, result.samples, result.already_present) == (0, 0, 1)
    path.write_bytes(big("t0", 1) + big("u1", 4) + big("u2", 5) + big("u3", 6))  # longer again
    result = ingest([str(path)], store)  # from the point the read of the truncated file left
    assert (result.files[0].resumed_from, result.samples, result.already_present) == (len(big("t0", 1)), 3, 0)
    assert ids(store) == ["t0#0", "t1#0", "t2#0", "u1#0", "u2#0", "u3#0"]


def test_a_file_rewritten_with_its_length_is_read_from_its_start(store, tmp_path):
    path = tmp_path / "server.log"
    original = big("s0", 1) + big("s1", 2) + json.dumps(vllm_chat("s2", [1], [([2], [-1.0])])).encode() + b"\n"
    path.write_bytes(original)
    ingest([str(path)], store)
    # the last block differs (and a record is added), then the first
    for old, new, counts in ((b'"s2"', b'"x2"', (2, 2)), (b'"s0"', b'"y0"', (1, 3))):
        rewritten = original.replace(old, new)
        assert len(rewritten) == len(original)
        path.write_bytes(rewritten + big("z", 9))
        result = ingest([str(path)], store)
        assert (result.files[0].resumed_from, result.samples, result.already_present) == (0, *counts)
        original = rewritten
    assert ids(store) == ["s0#0", "s1#0", "s2#0", "x2#0", "y0#0", "z#0"]


def test_a_compressed_file_is_read_whole(store, tmp_path):
    path = tmp_path / "server.log.gz"
    path.write_bytes(gzip.compress(big("g0", 1)))
    ingest([str(path)], store)
    assert "resume" not in entry(store)
    path.write_bytes(gzip.compress(big("g0", 1) + big("g1", 2)))
    result = ingest([str(path)], store)
    assert (result.files[0].resumed_from, result.samples, result.already_present) == (0, 1, 1)


def test_another_format_option_reads_from_the_start(store, tmp_path):
    path = tmp_path / "server.log"
    path.write_bytes(big("f0", 1))
    ingest([str(path)], store)
    assert entry(store)["resume"]["format_option"] == "auto"
    path.write_bytes(big("f0", 1) + big("f1", 2))
    result = ingest([str(path)], store, format="openai_chat")
    assert (result.files[0].resumed_from, result.samples, result.already_present) == (0, 1, 1)


def test_a_ledger_entry_without_a_resume_point_reads_from_the_start(store, tmp_path):
    """An entry without a resume point (no ``resume``, no ``read_from``), even with a txn naming its commit."""
    path = tmp_path / "server.log"
    path.write_bytes(big("o0", 1))
    written = Store(str(tmp_path / "written"))
    ingest([str(path)], written)
    old = {k: v for k, v in entry(written).items() if k not in ("resume", "read_from")}
    assert ResumePoint.from_entry(old) is None
    rows = pl.read_delta(written.table_uri("traces")).to_arrow()
    store.commit("traces", rows.to_batches(), metadata={"sources": [old]}, transactions={app_id(str(path)): 1})
    path.write_bytes(big("o0", 1) + big("o1", 2))
    result = ingest([str(path)], store)
    assert (result.files[0].resumed_from, result.samples, result.already_present) == (0, 1, 1)
    assert "resume" in entry(store)
    assert ids(store) == ["o0#0", "o1#0"]


def test_the_window_digests_the_first_and_last_block_of_a_prefix():
    window = PrefixWindow(block=4, keep=6)
    for chunk in (b"ab\ncd", b"\nefg\n", b"hi\nj"):
        window.add(chunk)

    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    assert window.digest(10) == PrefixDigest(10, 4, sha(b"ab\nc"), sha(b"efg\n"))
    assert window.digest(13) == PrefixDigest(13, 4, sha(b"ab\nc"), sha(b"\nhi\n"))
    assert window.digest(3) is None  # its last block is no longer kept
    assert (window.digest(12), window.digest(14), window.digest(0)) == (None, None, None)  # no newline there
    short = PrefixWindow(block=4)
    short.add(b"a\n")
    assert short.digest(2) == PrefixDigest(2, 4, sha(b"a\n"), sha(b"a\n"))
    short.seed(b"a\n", b"a\n", 2)  # continued from byte 2: the first block fills up with what follows
    short.add(b"bc\nd")
    assert short.digest(5) == PrefixDigest(5, 4, sha(b"a\nbc"), sha(b"\nbc\n"))


def test_a_last_line_quarantined_as_cut_is_read_whole_once_the_writer_finishes_it(store, tmp_path):
    path = tmp_path / "paused.jsonl"
    head, last = big("p0", 1), big("p1", 2)
    path.write_bytes(head + last[:100])
    stale = 1_000_000_000  # long past the grace period
    os.utime(path, ns=(stale, stale))
    first = ingest([str(path)], store, max_quarantine_rate=None)
    assert (first.samples, first.quarantined) == (1, {"truncated_line": 1})
    with open(path, "ab") as fh:  # the writer was only paused
        fh.write(last[100:])
    done = ingest([str(path)], store, max_quarantine_rate=None)
    assert (done.files[0].resumed_from, done.samples, done.quarantined) == (len(head), 1, {})
    assert ids(store) == ["p0#0", "p1#0"]


def test_an_sse_stream_quarantined_as_cut_is_read_whole_once_the_writer_finishes_it(store, tmp_path):
    """No run starts inside a stream an earlier run quarantined: the point stays at the stream's start."""
    path = tmp_path / "paused.sse"
    first, second = SSE[:_END], THIRD
    done_at = second.rfind(b"data: [DONE]")
    path.write_bytes(first)
    ingest([str(path)], store)
    with open(path, "ab") as fh:
        fh.write(second[:done_at])
    stale = 1_000_000_000
    os.utime(path, ns=(stale, stale))
    cut = ingest([str(path)], store, max_quarantine_rate=None)
    assert (cut.files[0].resumed_from, cut.samples, cut.quarantined) == (len(first), 0, {"truncated_stream": 1})
    assert "resume" not in entry(store)
    with open(path, "ab") as fh:  # the writer was only paused
        fh.write(second[done_at:])
    done = ingest([str(path)], store, max_quarantine_rate=None)
    assert (done.files[0].resumed_from, done.samples, done.quarantined) == (len(first), 2, {})
    assert ids(store) == [
        "chatcmpl-0ba70b30b73b6b0f5d789616dafd9053#0",
        "chatcmpl-3333333333333333333333333333333d#0",
        "chatcmpl-3333333333333333333333333333333d#1",
    ]


@pytest.mark.s3
def test_an_s3_object_rewritten_longer_is_read_on_from_where_the_last_run_stopped(s3):  # noqa: F811
    """An object store has no appends: a log shipped by rewriting its object with more lines is read with ranged
    reads from the end of what was consumed, and gives the tables of one read."""
    lines = LOG.split(b"\n")
    ends = [sum(len(line) + 1 for line in lines[:n]) for n in range(len(lines))]
    grown = Store(s3.url("stores/grown"))
    starts = []
    for cut in (ends[4] + 9, ends[11], len(LOG)):
        s3.put("logs/live.jsonl", LOG[:cut])
        result = ingest([s3.url("logs/live.jsonl")], grown, max_quarantine_rate=None)
        starts.append((result.files[0].resumed_from, result.bytes_read))
    assert starts == [(0, ends[4] + 9), (ends[4], ends[11] - ends[4]), (ends[11], len(LOG) - ends[11])]
    once = Store(s3.url("stores/once"))
    ingest([s3.url("logs/live.jsonl")], once, max_quarantine_rate=None)
    assert tables(grown) == tables(once)
