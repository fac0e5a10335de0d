"""One result protocol for every command (prl.results), rendering only in prl/report and prl/cli.py, and the
library entry points' signatures."""

from __future__ import annotations

import ast
import inspect
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import prl
from prl.checks.result import CheckResult
from prl.cli import app
from prl.export.tinker import ExportResult
from prl.ingestion.result import FileReport, IngestResult
from prl.ingestion.side_tables import SideIngestResult
from prl.pipeline.runner import RunResult, StepResult
from prl.report.inspect import ShardsInspection, StoreInspection
from prl.results import CommandResult, ErrorResult
from prl.score.run import ScoreResult
from prl.shards.build import ShardResult
from prl.shards.verify import Problem, VerifyResult
from tests.pipeline_helpers import GrowingInput

PRL = Path(prl.__file__).parent
runner = CliRunner()

RESULTS = {
    "ingest": IngestResult("/s", files=[FileReport("/in/a.jsonl", status="failed", error="bad")], samples=3),
    "ingest --kind rewards": SideIngestResult("/s", "rewards", files=1, rows=20, quarantined={"bad_value": 1}),
    "check-tokens": CheckResult("/s", "tok", "f" * 64, False, 1, checked=4, max_drift_rate=0.0),
    "build-shards": ShardResult("/out", "built", set_id="set-1", rows=5, tokens=50, drops={"stale": 2}),
    "export": ExportResult("/d.jsonl", rows=5, skipped=0, shards=1),
    "run": RunResult("r.toml", "/s", steps=[StepResult("ingest", "done", result_headline="ingest: 3 samples new")]),
    "inspect": StoreInspection("/s", tables={"traces": {"version": 2, "rows": 7, "files": 1, "bytes": 10}}),
    "inspect shards": ShardsInspection("/out", sets=[{"rows": 5, "tokens": 50, "shards": 1, "groups": 2}]),
    "verify": VerifyResult("/out", problems=[Problem("set-1", "part-0.parquet", "sha256 differs")]),
    "error": ErrorResult("check-tokens", "line one\nline two", 2),
    "score-ref": ScoreResult("/s", "ref", "vllm", "http://127.0.0.1:1", candidates=4, scored=4),
}


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_every_result_keeps_the_protocol(name):
    result = RESULTS[name]
    assert isinstance(result, CommandResult)
    payload = json.loads(json.dumps(result.to_json()))
    assert payload["exit_code"] == int(result.exit_code)
    assert payload["command"] == name.removesuffix(" shards").replace("error", "check-tokens")
    headline = result.headline()
    assert isinstance(headline, str) and headline and "\n" not in headline and "[" not in headline.split(":")[0]


def test_headlines_say_what_happened():
    assert RESULTS["ingest"].headline() == (
        "ingest: 3 samples new (0 tokens), 0 already present, 0 quarantined (0.00%); 1 file (0 unchanged, 1 failed)"
    )
    assert RESULTS["ingest --kind rewards"].headline() == (
        "ingest --kind rewards: 20 rows written, 0 already present, 1 quarantined; 1 file read, 0 unchanged"
    )
    assert (
        RESULTS["build-shards"].headline() == "build-shards built: 5 samples, 50 tokens in 0 shards, 2 dropped → set-1"
    )
    assert RESULTS["inspect shards"].headline() == "1 shard set in /out: 5 rows, 2 groups, 50 tokens in 1 shard"
    assert RESULTS["verify"].headline() == "verify 1 problem(s): 0 set(s), 0 shards, 0 rows, 0 tokens in /out"
    assert RESULTS["run"].headline() == "run: ingest done; exit 0 after 0.00s"
    assert RESULTS["run"].steps[0].headline() == "ingest: 3 samples new"
    assert RESULTS["inspect"].headline() == "store /s: traces v2 (7 rows)"
    assert RESULTS["error"].headline() == "check-tokens: error: line one line two"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_rich_is_imported_only_by_the_report_package_and_the_cli():
    offenders = [
        str(path.relative_to(PRL))
        for path in sorted(PRL.rglob("*.py"))
        if "rich" in _imports(path) and path.parent.name != "report" and path.name != "cli.py"
    ]
    assert offenders == []


def test_library_entry_points_take_a_store_or_its_uri_and_keyword_only_flags():
    for function, positional in (
        (prl.ingest, ["sources", "store"]),
        (prl.ingest_side_table, ["sources", "store"]),
        (prl.check_tokens, ["store", "tokenizer"]),
        (prl.export_tinker, ["shard_dir", "out_jsonl"]),
    ):
        parameters = inspect.signature(function).parameters.values()
        assert [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD] == positional, function
        if "store" in positional:
            assert "Store | str" in str(inspect.signature(function).parameters["store"].annotation)


def test_library_check_tokens_takes_the_store_uri(tmp_path, tokenizer_dir):
    data = GrowingInput(tmp_path / "in", files=1, seed=3)
    data.grow(4)
    store = str(tmp_path / "store")
    prl.ingest([str(data.root / "traces")], store)
    result = prl.check_tokens(store, tokenizer_dir, dry_run=True)
    assert (result.checked, result.dry_run) == (len(data.good), True)


def test_run_step_table_shows_each_step_headline(tmp_path):
    data = GrowingInput(tmp_path / "in", files=1, seed=4)
    data.grow(5)
    res = runner.invoke(app, ["run", str(data.recipe(tmp_path / "store", tmp_path / "out")), "--only", "ingest"])
    assert res.exit_code == 0, res.output
    assert f"ingest: {len(data.good)} samples new" in " ".join(res.stdout.split())


def test_cli_reference_usage_lines_name_the_arguments():
    with open(os.path.join(os.path.dirname(PRL), "docs", "cli.md"), encoding="utf-8") as fh:
        usage = [line for line in fh if line.startswith("`prl ") and "COMMAND" not in line]
    assert "`prl ingest [OPTIONS] SOURCES...`\n" in usage
    assert "`prl export [OPTIONS] SHARDS OUT`\n" in usage
    assert not [line for line in usage if "{" in line]


def test_build_shards_headline_says_which_drops_are_old_and_how_to_mend_unchecked():
    one = ShardResult("/out", "built", set_id="s", rows=1, tokens=1, shards=[{"file": "p"}], drops={"stale": 1})
    assert one.headline() == "build-shards built: 1 sample, 1 token in 1 shard, 1 dropped → s"
    again = ShardResult("/out", "nothing_new", drops={"missing_reward": 30, "verdict_drift": 5}, dropped_before=35)
    assert again.headline() == (
        "build-shards nothing_new: 0 samples, 0 tokens in 0 shards, 35 dropped (all dropped by an earlier build too)"
    )
    again.dropped_before = 12
    assert again.headline().endswith("35 dropped (12 of them by an earlier build too)")
    again.dropped_before = None  # a whole scan: not known
    assert again.headline().endswith("in 0 shards, 35 dropped")
    assert again.to_json()["dropped_before"] is None
    unchecked = ShardResult("/out", "all_dropped", drops={"unchecked": 7}, all_dropped=True)
    assert unchecked.headline() == (
        "build-shards all_dropped: every new sample was dropped: 7 of 7 as unchecked (no check-tokens verdict for "
        "them: run `prl check-tokens` on the store first, or set require_checks=false to ship unchecked samples)"
    )
