"""check_tokens as a whole: incremental runs, fingerprints, sampling, dry runs, usage errors, exit codes,
JSON and rich rendering."""

from __future__ import annotations

import io
import json
import os

import pytest
from rich.console import Console

from prl.checks import CheckOptions, check_tokens
from prl.errors import UsageError
from prl.ingestion.side_tables import ingest_side_table
from prl.report.checks import render
from prl.store.tables import Store
from tests.checks_helpers import EOS, TRACES_SCHEMA_TABLE, chat_prompt, enc, make_store, row, tokenizer_dir
from tests.delta_log import commit_infos

PROMPT = chat_prompt("Greet")
GOOD = [*enc("Hello world."), EOS]
SPLIT_PROMPT = (
    enc("<｜begin▁of▁sentence｜>You are helpful.<｜User｜>")
    + enc("Hel")
    + enc("lo world.")
    + enc("<｜Assistant｜></think>")
)
"""A prompt whose IDs are not what the tokenizer makes of its text ("Hel" + "lo"): drift (roundtrip_prompt)."""


def rows(n_good, n_split, prefix=""):
    out = [row(f"{prefix}g{i}", PROMPT, GOOD) for i in range(n_good)]
    out += [row(f"{prefix}s{i}", SPLIT_PROMPT, GOOD) for i in range(n_split)]
    return out


def test_incremental_runs_check_only_new_samples(tmp_path):
    store = make_store(tmp_path, rows(3, 1))
    first = check_tokens(store, tokenizer_dir())
    assert (first.checked, first.skipped_existing, first.checks_version) == (4, 0, 1)
    again = check_tokens(store, tokenizer_dir())
    assert (again.checked, again.skipped_existing, again.checks_version, again.exit_code) == (0, 4, None, 0)
    store.commit("traces", TRACES_SCHEMA_TABLE(rows(2, 0, prefix="new")).to_batches())
    third = check_tokens(store, tokenizer_dir())
    assert (third.checked, third.skipped_existing, third.verdicts["ok"]) == (2, 4, 2)
    assert store.read("checks").num_rows == 6
    info = commit_infos(store, "checks", 1)[0]
    assert info["prl.tokenizer_fingerprint"] == third.fingerprint
    assert info["prl.traces_version"] == 2


def test_changed_options_or_template_recheck(tmp_path):
    store = make_store(tmp_path, rows(2, 0))
    a = check_tokens(store, tokenizer_dir())
    b = check_tokens(store, tokenizer_dir(), options=CheckOptions(realign_window=2))
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    c = check_tokens(store, tokenizer_dir(), chat_template=str(tpl))
    assert len({a.fingerprint, b.fingerprint, c.fingerprint}) == 3
    assert (a.checked, b.checked, c.checked) == (2, 2, 2)
    assert store.read("checks").num_rows == 6


def test_dry_run_writes_nothing(tmp_path):
    store = make_store(tmp_path, rows(2, 1))
    result = check_tokens(store, tokenizer_dir(), dry_run=True)
    assert (result.checked, result.verdicts["drift"], result.checks_version) == (3, 1, None)
    assert store.version("checks") is None


def test_sample_rate_is_deterministic(tmp_path):
    store = make_store(tmp_path, rows(200, 0))
    a = check_tokens(store, tokenizer_dir(), sample_rate=0.25, dry_run=True)
    b = check_tokens(store, tokenizer_dir(), sample_rate=0.25, dry_run=True)
    assert a.checked == b.checked and a.checked + a.sampled_out == 200
    assert 25 <= a.checked <= 75


def test_exit_code_follows_max_drift_rate_and_allow_warn(tmp_path):
    """drift counts; warn (a check that could not be completed) counts when warns are not allowed; a note (here
    a stop without a stop token: information about what was sampled) never counts."""
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    warn = row("w", PROMPT, GOOD, messages="{not json")
    note = row("n", PROMPT, GOOD[:-1], [-0.25] * (len(GOOD) - 1))
    store = make_store(tmp_path / "s", [*rows(3, 1), warn, note])
    r = check_tokens(store, tokenizer_dir(), chat_template=str(tpl), max_drift_rate=0.2, dry_run=True)
    assert r.verdicts == {"ok": 3, "note": 1, "warn": 1, "drift": 1, "invalid": 0}
    assert r.reasons == {"roundtrip_prompt": 1, "template_error": 1, "special_no_stop": 1}
    assert (r.drift_rate, r.exit_code) == (1 / 6, 0)
    r = check_tokens(store, tokenizer_dir(), chat_template=str(tpl), max_drift_rate=0.1, dry_run=True)
    assert r.exit_code == 1
    r = check_tokens(store, tokenizer_dir(), chat_template=str(tpl), max_drift_rate=0.2, allow_warn=False, dry_run=True)
    assert (r.drift_rate, r.exit_code) == (2 / 6, 1)
    r = check_tokens(store, tokenizer_dir(), chat_template=str(tpl), dry_run=True)
    assert r.exit_code == 0


def test_usage_errors(tmp_path):
    store = make_store(tmp_path, rows(1, 0))
    with pytest.raises(UsageError, match="tokenizer not found"):
        check_tokens(store, str(tmp_path / "nope"))
    with pytest.raises(UsageError, match=r"no tokenizer\.json"):
        check_tokens(store, str(tmp_path))
    with pytest.raises(UsageError, match="chat template file not found"):
        check_tokens(store, tokenizer_dir(), chat_template=str(tmp_path / "missing.jinja"))
    with pytest.raises(UsageError, match=r"^--sample-rate: expected a number in \(0, 1\], got 0.0$"):
        check_tokens(store, tokenizer_dir(), sample_rate=0.0)
    with pytest.raises(UsageError, match=r"^--max-drift-rate: expected a number in \[0, 1\], got 2.0$"):
        check_tokens(store, tokenizer_dir(), max_drift_rate=2.0)


def test_tokenizer_that_does_not_match_the_data(tmp_path):
    foreign = [row(f"x{i}", [150000, 151000], [151643, 152000]) for i in range(3)]
    store = make_store(tmp_path, foreign)
    with pytest.raises(UsageError, match=r"does not match the data: 3 of 3 samples .* \(largest ID 152000\)"):
        check_tokens(store, tokenizer_dir())
    assert store.version("checks") is None


def test_empty_folder_is_no_store_and_a_store_without_traces_checks_nothing(tmp_path):
    with pytest.raises(UsageError, match="is not a prl store: it holds no prl table"):
        check_tokens(Store(str(tmp_path)), tokenizer_dir())
    assert os.listdir(tmp_path) == []  # no _locks folder either
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text('{"sample_id": "s", "reward": 1}\n')
    ingest_side_table([str(rewards)], str(tmp_path / "store"), kind="rewards")
    result = check_tokens(str(tmp_path / "store"), tokenizer_dir())
    assert (result.checked, result.traces_version, result.exit_code) == (0, None, 0)


def test_json_and_report(tmp_path):
    store = make_store(tmp_path, rows(2, 1))
    result = check_tokens(store, tokenizer_dir(), max_drift_rate=0.5)
    data = json.loads(json.dumps(result.to_json()))
    assert data["verdicts"] == {"ok": 2, "note": 0, "warn": 0, "drift": 1, "invalid": 0}
    assert data["check_rates"]["roundtrip"] == pytest.approx(1 / 3)
    assert data["group_rates"]["source_format"]["vllm_chat"] == pytest.approx(1 / 3)
    assert data["reasons"] == {"roundtrip_prompt": 1}
    assert data["exit_code"] == 0
    assert data["worst"][0]["sample_id"] == "s0"
    buf = io.StringIO()
    render(result, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "[ 14505 'Hel'][  4979 'lo']" in text
    assert "[ 19923 'Hello'][  2058 ' world']" in text
    assert "roundtrip_prompt" in text


def test_the_summary_counts_groups_by_value_with_none_first_over_batches():
    """Each group column's values in the summary: per value its checked count and each verdict's, a null value
    as ``(none)``, values in sorted order with ``(none)`` first, counts added over batches."""
    import pyarrow as pa

    from prl.checks.result import CheckResult
    from prl.checks.run import _tally

    result = CheckResult(store="s", tokenizer="t", fingerprint="f", template=False, traces_version=0)

    def batch(verdicts, models):
        n = len(verdicts)
        return pa.record_batch(
            {
                "sample_id": [f"s{i}" for i in range(n)],
                "verdict": verdicts,
                "source_format": ["openai_chat"] * n,
                "model": models,
                "policy_version": [None] * n,
            }
        )

    _tally(result, batch(["ok", "drift", "ok", "ok"], ["b", "b", None, "a"]), [], [], [], 0)
    _tally(result, batch(["warn", "ok"], ["a", None]), [], [], [], 0)
    assert result.checked == 6
    assert result.verdicts == {**dict.fromkeys(result.verdicts, 0), "ok": 4, "drift": 1, "warn": 1}
    assert list(result.groups["model"].items()) == [
        ("(none)", {"checked": 2, "ok": 2}),
        ("a", {"checked": 2, "ok": 1, "warn": 1}),
        ("b", {"checked": 2, "drift": 1, "ok": 1}),
    ]
    assert result.groups["policy_version"] == {"(none)": {"checked": 6, "drift": 1, "ok": 4, "warn": 1}}
    assert result.groups["source_format"] == {"openai_chat": {"checked": 6, "drift": 1, "ok": 4, "warn": 1}}
