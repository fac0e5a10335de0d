"""``prl check-tokens`` renders chat templates under a time, memory and size budget: a runaway template is a
``template_budget`` verdict for the samples it broke on, not a hang or a 3 GB allocation, and the other samples
are checked as usual."""

from __future__ import annotations

import json
import time

import orjson
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from prl import bounds
from prl.checks.template_worker import MAX_TEMPLATE_TIMEOUTS, Rendered, TemplateWorker
from prl.cli import app
from tests.checks_helpers import EOS, enc, make_store, row, tokenizer_dir

runner = CliRunner()

TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.content == 'spin' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% elif m.content == 'grow' %}{{ 'x' * 3000000000 }}"
    "{% elif m.content == 'wide' %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}"
    "{% endfor %}"
)


def _messages(content: str) -> str:
    return orjson.dumps([{"role": "user", "content": content}]).decode()


@pytest.mark.slow
@pytest.mark.campaign  # long: `make test-all`
def test_runaway_templates_get_a_budget_verdict_and_the_rest_is_checked(tmp_path):
    hello = enc("hello")
    rows = [
        row(name, hello, [*enc(" there"), EOS], messages=_messages(content))
        for name, content in (("ok", "hello"), ("spin", "spin"), ("grow", "grow"), ("wide", "wide"), ("after", "hello"))
    ]
    store = make_store(str(tmp_path / "store"), rows)
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    started = time.monotonic()
    args = ["check-tokens", "--store", store.uri, "--tokenizer", tokenizer_dir(), "--chat-template", str(template)]
    res = runner.invoke(app, [*args, "--json"])
    elapsed = time.monotonic() - started
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["reasons"].get("template_budget") == 3 and summary["reason_verdicts"]["template_budget"] == "warn"
    checks = store.read("checks", columns=["sample_id", "reasons", "detail"])
    by_id = {
        sid: (reasons or [], json.loads(detail or "{}"))
        for sid, reasons, detail in zip(*(c.to_pylist() for c in checks.columns), strict=True)
    }
    assert "template_budget" not in by_id["ok"][0] and "template_budget" not in by_id["after"][0]
    assert by_id["spin"][1]["template_budget"] == "rendering took longer than 5 s"
    assert by_id["grow"][1]["template_budget"] == "rendering needs more than 1024 MiB of memory"
    assert by_id["wide"][1]["template_budget"].startswith("rendering is longer than")
    assert elapsed < 60  # one time budget (5 s), a worker restart, the rest in milliseconds
    assert pc.sum(pc.list_value_length(checks.column("reasons"))).as_py() >= 3


def test_the_worker_renders_in_order_and_recovers_after_a_kill():
    worker = TemplateWorker(seconds=2.0)
    try:
        texts = [_messages("a"), _messages("spin"), "not json", _messages("b")]
        got = worker.render(TEMPLATE, {}, "", texts)
        assert got[0] == Rendered(text="a") and got[3] == Rendered(text="b")
        assert got[1] == Rendered(budget="rendering took longer than 2 s")
        assert got[2].error is not None and got[2].error.startswith("JSONDecodeError")
        first = worker.proc
        assert worker.render("{{ messages[0].content }}!", {}, "", [_messages("c")]) == [Rendered(text="c!")]
        assert worker.proc is first  # a worker that kept its budget is reused
    finally:
        worker.close()
    assert worker.proc is None


@pytest.mark.campaign  # long: `make test-all`
def test_a_run_stops_rendering_after_its_budget_of_time_outs():
    """A template that loops on every conversation costs the run ``max_timeouts`` render budgets, not one per
    conversation: after them, every conversation not rendered yet is ``template_budget`` at once."""
    worker = TemplateWorker(seconds=1.0, max_timeouts=2)
    try:
        texts = [_messages("a"), *(_messages("spin") for _ in range(6)), _messages("b")]
        got = worker.render(TEMPLATE, {}, "", texts)
        assert got[0] == Rendered(text="a")
        assert got[1:3] == [Rendered(budget="rendering took longer than 1 s")] * 2
        skipped = Rendered(
            budget="not rendered: 2 conversations of this run took longer than 1 s to render "
            "(the run's limit, --max-template-timeouts, is 2)"
        )
        assert got[3:] == [skipped] * 5
        assert worker.timeouts == 2
        assert worker.render(TEMPLATE, {}, "", [_messages("c")]) == [skipped]  # for the rest of the run
        assert worker.proc is None  # no worker started again
        died = TemplateWorker(seconds=30.0, max_timeouts=1)
        assert died.render(TEMPLATE, {}, "", [_messages("grow"), _messages("d")])[1] == Rendered(text="d")
        assert died.timeouts == 0  # out of memory is no time-out
        died.close()
    finally:
        worker.close()


@pytest.mark.slow
def test_check_tokens_takes_the_run_wide_budget_as_an_option(tmp_path):
    hello = enc("hello")
    contents = ["hello", *(f"spin{i}" for i in range(5))]
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE.replace("m.content == 'spin'", "m.content.startswith('spin')"))
    rows = [row(f"s{i}", hello, [*enc(" there"), EOS], messages=_messages(c)) for i, c in enumerate(contents)]
    store = make_store(str(tmp_path / "store"), rows)
    args = ["check-tokens", "--store", store.uri, "--tokenizer", tokenizer_dir(), "--chat-template", str(template)]
    res = runner.invoke(app, [*args, "--max-template-timeouts", "1", "--json"])
    assert res.exit_code == 0, res.output
    checks = store.read("checks", columns=["sample_id", "detail"]).to_pylist()
    budgets = sorted(json.loads(c["detail"] or "{}").get("template_budget", "") for c in checks)
    assert budgets == [
        "",
        *[
            "not rendered: 1 conversations of this run took longer than 5 s to render (the run's limit, "
            "--max-template-timeouts, is 1)"
        ]
        * 4,
        "rendering took longer than 5 s",
    ]
    for bad in ("0", "-1", "1000001", "99999999999999999999"):
        res = runner.invoke(app, [*args, "--max-template-timeouts", bad, "--json"])
        assert (res.exit_code, json.loads(res.stdout)["exit_code"]) == (2, 2)
    assert bounds.TEMPLATE_TIMEOUTS == MAX_TEMPLATE_TIMEOUTS == 3
