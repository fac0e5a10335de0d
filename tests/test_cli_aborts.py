"""A process the command line runs in that is aborted by a native library (SIGABRT: a Rust panic while panicking,
a failed Arrow check, a fatal Python error at exit) leaves the Python stack of every thread on stderr, so the
place is known even when it cannot be reproduced."""

from __future__ import annotations

import subprocess
import sys

from tests.pipeline_helpers import prl_env

ABORTING = """
import os, sys
import prl.report.inspect
from prl import cli

def inspect_that_aborts(path):
    os.abort()

prl.report.inspect.inspect = inspect_that_aborts
sys.argv = ["prl", "inspect", "anywhere"]
cli.main()
"""


def test_an_abort_leaves_every_threads_stack_on_stderr():
    proc = subprocess.run([sys.executable, "-c", ABORTING], capture_output=True, text=True, env=prl_env(), timeout=120)
    assert proc.returncode == -6
    assert "Fatal Python error: Aborted" in proc.stderr
    assert "line 7 in inspect_that_aborts" in proc.stderr, proc.stderr[-2000:]
