"""The prl command's process settings: made unless the environment already says, and only those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from typer.testing import CliRunner

from prl import cli

SETTINGS = (
    "OPENBLAS_NUM_THREADS",
    "MIMALLOC_PURGE_DELAY",
    "_RJEM_MALLOC_CONF",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
)
JEMALLOC = "dirty_decay_ms:1000,muzzy_decay_ms:0"
DEFAULTS = {"OPENBLAS_NUM_THREADS": "1", "MIMALLOC_PURGE_DELAY": "1000", "_RJEM_MALLOC_CONF": JEMALLOC}
CALL = (
    "import json, os; from prl.runtime import set_process_defaults; made = set_process_defaults(); "
    "print(json.dumps([made, os.environ.get('MIMALLOC_PURGE_DELAY')]))"
)


def made_in_a_fresh_process(before: str = "", **env: str) -> list:
    clean = {k: v for k, v in os.environ.items() if k not in (*SETTINGS, "GLIBC_TUNABLES")}
    code = before + CALL
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_every_setting_is_made_in_a_bare_environment():
    assert made_in_a_fresh_process() == [DEFAULTS, "1000"]


def test_settings_the_environment_makes_are_left_alone():
    both = {"OPENBLAS_NUM_THREADS": "2", "MIMALLOC_PURGE_DELAY": "10", "_RJEM_MALLOC_CONF": "narenas:1"}
    assert made_in_a_fresh_process(**both) == [{}, "10"]
    made, purge = made_in_a_fresh_process(OPENBLAS_NUM_THREADS="4")
    assert (made, purge) == ({"MIMALLOC_PURGE_DELAY": "1000", "_RJEM_MALLOC_CONF": JEMALLOC}, "1000")


def test_glibc_malloc_is_left_to_the_environment():
    # no mallopt call: glibc's thresholds stay what glibc (or MALLOC_*_ / GLIBC_TUNABLES) makes them
    made, _ = made_in_a_fresh_process(MALLOC_TRIM_THRESHOLD_="5")
    assert made == DEFAULTS
    code = "import prl.runtime, sys; print('ctypes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


def test_variables_read_at_import_are_left_alone_once_their_library_is_loaded():
    made, purge = made_in_a_fresh_process("import numpy, pyarrow, polars; ")
    assert made == {}
    assert purge is None


def test_importing_the_command_loads_neither_numpy_nor_pyarrow():
    # the settings above must come before either library loads: prl.cli may not import them at module level
    code = "import sys, prl.cli; print('numpy' in sys.modules, 'pyarrow' in sys.modules, 'polars' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_numpy_starts_no_blas_threads_after_the_settings():
    # (without the setting numpy's OpenBLAS starts a thread per core: this fails on any machine with two or more)
    code = "from prl.runtime import set_process_defaults; set_process_defaults(); import numpy, os; "
    code += "print(len(os.listdir('/proc/self/task')))"
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_the_command_makes_them_before_it_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "set_process_defaults", lambda: calls.append("settings"))
    monkeypatch.setattr(cli, "app", lambda: calls.append("command"))
    monkeypatch.setattr(cli.signal, "signal", lambda *args: None)
    monkeypatch.setattr(cli.SESSION, "quiet_signals", False)  # main() sets it for the process: undone after
    cli.main()
    assert cli.SESSION.quiet_signals
    assert calls == ["settings", "command"]


def test_a_command_run_off_the_main_thread_still_prints_its_one_json_object(monkeypatch, tmp_path):
    # once main() made signals quiet, the summary of a command run in a thread (a library user's, a test's) must
    # not try to change signal handlers there: that raises ValueError and no JSON would be printed
    monkeypatch.setattr(cli.SESSION, "quiet_signals", True)
    done: dict = {}
    args = ["inspect", str(tmp_path / "no-store"), "--json"]
    thread = threading.Thread(target=lambda: done.update(res=CliRunner().invoke(cli.app, args)))
    thread.start()
    thread.join(60)
    res = done["res"]
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    (line,) = res.stdout.strip().splitlines()
    assert json.loads(line)["exit_code"] == res.exit_code == 2
