"""check-tokens' "already checked": new traces files only, exactly once after kills, full scan when it must."""

from __future__ import annotations

import pytest

from prl.checks import check_tokens
from prl.checks.progress import app_id, progress
from tests.checks_helpers import EOS, TRACES_SCHEMA_TABLE, chat_prompt, enc, make_store, row, tokenizer_dir
from tests.delta_log import commit_infos

PROMPT = chat_prompt("Greet")
GOOD = [*enc("Hello world."), EOS]


def rows(n: int, prefix: str) -> list[dict]:
    return [row(f"{prefix}{i}", PROMPT, GOOD) for i in range(n)]


def checked_ids(store) -> list[str]:
    return sorted(store.read("checks").column("sample_id").to_pylist())


def test_a_complete_run_sets_a_watermark_and_the_next_reads_only_new_files(tmp_path):
    store = make_store(tmp_path, rows(3, "old"))
    first = check_tokens(store, tokenizer_dir())
    key = app_id(store, first.fingerprint, 1.0)
    assert store.open("checks").transaction_version(key) == store.version("traces") == 1
    old_files = [f for f in (tmp_path / "traces").iterdir() if f.suffix == ".parquet"]
    store.commit("traces", TRACES_SCHEMA_TABLE(rows(2, "new")).to_batches())
    for path in old_files:  # an incremental run that opened an old file would fail on it
        path.write_bytes(b"not parquet")
    again = check_tokens(store, tokenizer_dir())
    assert (again.checked, again.skipped_existing) == (2, 3)
    assert store.open("checks").transaction_version(key) == 2
    assert commit_infos(store, "checks", 1)[0]["prl.checked_total"] == 5


def test_a_run_killed_between_chunks_is_finished_exactly_once(tmp_path):
    store = make_store(tmp_path, rows(2, "a"))
    check_tokens(store, tokenizer_dir())
    store.commit("traces", TRACES_SCHEMA_TABLE(rows(6, "b")).to_batches())
    batches = []

    def die_after_two(n: int) -> None:
        batches.append(n)
        if len(batches) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        check_tokens(store, tokenizer_dir(), batch_size=2, commit_rows=2, on_batch=die_after_two)
    assert len(checked_ids(store)) == 2 + 4  # two chunks of the new rows were committed, no watermark moved
    rest = check_tokens(store, tokenizer_dir())
    assert (rest.checked, rest.skipped_existing) == (2, 6)
    assert checked_ids(store) == sorted([f"a{i}" for i in range(2)] + [f"b{i}" for i in range(6)])
    assert check_tokens(store, tokenizer_dir()).checked == 0


def test_another_sample_rate_or_a_recreated_traces_table_scans_everything(tmp_path):
    store = make_store(tmp_path, rows(4, "s"))
    half = check_tokens(store, tokenizer_dir(), sample_rate=0.5)
    full = check_tokens(store, tokenizer_dir())
    assert half.checked + half.sampled_out == 4 and full.checked == 4 - half.checked
    plan = progress(store, full.fingerprint, 1.0, store.version("traces"))
    assert plan.up_to_date and plan.previously == 4


def test_a_log_cleaned_past_the_watermark_falls_back_to_the_anti_join(tmp_path):
    store = make_store(tmp_path, rows(2, "x"))
    first = check_tokens(store, tokenizer_dir())
    store.open("checks").create_checkpoint()  # the snapshot keeps the watermark; its commit file goes
    for version in (0, 1):
        log = tmp_path / "checks" / "_delta_log" / f"{version:020d}.json"
        log.rename(log.with_suffix(".gone"))
    assert store.open("checks").transaction_version(app_id(store, first.fingerprint, 1.0)) == 1
    store.commit("traces", TRACES_SCHEMA_TABLE(rows(1, "y")).to_batches())
    plan = progress(store, first.fingerprint, 1.0, store.version("traces"))
    assert plan.paths is None and plan.covered is None
