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

from prl.checks.template_worker import Rendered, TemplateWorker
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
