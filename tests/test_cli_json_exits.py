"""Every way a command line ends prints, under ``--json``, exactly one JSON object whose ``exit_code`` is the
process's: usage errors click raises before any command runs, and interrupts from the first instant."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from prl.cli import app
from tests.pipeline_helpers import prl_env

runner = CliRunner()


def one_json(stdout: str, code: int) -> dict:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    summary = json.loads(lines[0])
    assert summary["exit_code"] == code
    return summary


@pytest.mark.parametrize(
    ("args", "command", "message"),
    [
        (["ingest"], "ingest", "Missing argument 'sources'."),
        (["ingest", "in.jsonl"], "ingest", "Missing option '--store'."),
        (["check-tokens", "--store", "s", "--tokenizer", "t", "--bogus"], "check-tokens", "No such option: --bogus"),
        (
            ["check-tokens", "--store", "s", "--tokenizer", "t", "--sample-rate", "abc"],
            "check-tokens",
            "'--sample-rate'",
        ),
        (["ingest", "in.jsonl", "--store", "s", "--kind", "bogus"], "ingest", "'bogus' is not one of"),
        (["build-shards", "--store", "s"], "build-shards", "Missing option '--out'."),
        (["no-such-command"], "no-such-command", "No such command 'no-such-command'."),
    ],
)
def test_usage_errors_print_one_json_object_and_exit_2(tmp_path, monkeypatch, args, command, message):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 2
    summary = one_json(res.stdout, 2)
    assert summary["command"] == command and message in summary["error"]
    assert os.listdir(tmp_path) == []  # nothing was created
    assert "Usage: prl" in res.stderr


def test_usage_error_without_json_prints_usage_only_on_stderr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["ingest", "in.jsonl", "--store", "s", "--kind", "bogus"])
    assert (res.exit_code, res.stdout) == (2, "")
    assert "Usage: prl ingest [OPTIONS]" in res.stderr and "'bogus' is not one of" in res.stderr


def test_help_is_text_and_exit_0():
    res = runner.invoke(app, ["ingest", "--help", "--json"])
    assert res.exit_code == 0 and "--store" in res.stdout and not res.stdout.lstrip().startswith("{")


# --- interrupts from the first instant -----------------------------------------------------------------------
INTERRUPT_DURING_IMPORT = """
import importlib.abc, os, signal, sys

class InterruptAtTyper(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "typer":  # while prl.cli loads its command-line libraries
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAtTyper())
sys.argv = ["prl", *sys.argv[1:]]
from prl.__main__ import main
main()
"""


def test_sigint_while_the_command_line_loads_prints_the_json_object(tmp_path):
    argv = [sys.executable, "-c", INTERRUPT_DURING_IMPORT, "ingest", "in", "--store", str(tmp_path / "s"), "--json"]
    res = subprocess.run(argv, env=prl_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 130, res.stderr
    assert one_json(res.stdout, 130) == {"command": "ingest", "error": "interrupted", "exit_code": 130}
    assert not (tmp_path / "s").exists()


STARTED = """
import sys
import prl.__main__ as entry
sys.argv = ["prl", *sys.argv[1:]]
sys.stderr.write("started\\n")
sys.stderr.flush()
entry.main()
"""


def _interrupted_run(argv: list[str], delay: float) -> tuple[int, str, str]:
    """Start ``argv`` (which writes ``started`` just before it calls prl's entry point), SIGINT it ``delay`` s
    after that line arrives: ``(returncode, stdout, stderr)``. A signal that lands in the few lines between that
    write and the entry point (a loaded machine can pause the child there) is no instant of prl's: Python's own
    ``KeyboardInterrupt`` traceback names only the ``-c`` script's frames then, and the run is made again."""
    for _ in range(10):
        proc = subprocess.Popen(argv, env=prl_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None and proc.stderr.readline() == "started\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        uncaught = proc.returncode == -signal.SIGINT and stderr.rstrip().endswith("KeyboardInterrupt")
        if not (uncaught and 'File "<string>"' in stderr and "prl" not in stderr):
            return proc.returncode, stdout, stderr
    raise AssertionError("every signal landed before prl's entry point ran")


@pytest.mark.parametrize("delay", [0.01, 0.03, 0.1, 0.3])
def test_sigint_at_any_instant_after_start_exits_130_with_one_json_object(tmp_path, delay):
    """The console script interrupted at staggered instants from the moment prl's code runs (before that, the
    interpreter itself is starting up: a signal kills it, or Python reports that ``site`` failed to import):
    each run ends with 130 and one JSON object, or with 0 and the command's own summary if it finished first."""
    traces = tmp_path / "t.jsonl"
    traces.write_text("")
    argv = [sys.executable, "-c", STARTED, "ingest", str(traces), "--store", str(tmp_path / "s"), "--json"]
    returncode, stdout, stderr = _interrupted_run(argv, delay)
    assert returncode in (0, 130), stderr
    summary = one_json(stdout, returncode)
    if returncode == 130:
        assert summary == {"command": "ingest", "error": "interrupted", "exit_code": 130}
    else:
        assert summary["command"] == "ingest" and summary["files"][0]["status"] == "empty"
