"""Entries of a source folder that cannot be read are reported one by one and never block the files beside them:
FIFOs, sockets and devices are skipped; dangling symlinks, symlink loops and unreadable files fail (exit 2) while
the rest is ingested. ``package:NAME`` in a recipe finds a package's folder without running its code."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from prl.io.sources import SourceProblem, scan
from tests.pipeline_helpers import GrowingInput, prl_argv, prl_env, write_recipe


def _unprivileged(argv: list[str]) -> list[str]:
    """Run ``argv`` without the capabilities that let root read any file (so mode 000 means unreadable)."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a file cannot be made unreadable")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, "--bounding-set", caps, "--inh-caps", caps, *argv]


@pytest.fixture
def folder(tmp_path):
    """A folder with one good trace file and one of each kind of entry that cannot be read."""
    data = GrowingInput(tmp_path / "in", files=1, seed=8, bad_every=10_000)
    data.grow(5)
    root = data.root / "traces"
    os.mkfifo(root / "pipe.jsonl")  # a reader would wait for a writer forever
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "sock.jsonl"))
    os.symlink(root / "gone.jsonl", root / "dangling.jsonl")
    os.symlink(root / "loop-b.jsonl", root / "loop-a.jsonl")
    os.symlink(root / "loop-a.jsonl", root / "loop-b.jsonl")
    (root / "secret.jsonl").write_text("{}\n")
    (root / "secret.jsonl").chmod(0)
    yield data, root
    listener.close()


def test_scan_reports_each_entry_that_is_not_read(folder):
    _, root = folder
    found = scan([str(root)])
    readable = ["part-0.jsonl", "secret.jsonl"] if os.geteuid() == 0 else ["part-0.jsonl"]  # root reads mode 000
    assert [os.path.basename(f.uri) for f in found.files] == readable
    problems = {os.path.basename(p.uri): (p.status, p.reason) for p in found.problems}
    assert problems["pipe.jsonl"] == ("skipped", "not a regular file (a FIFO)")
    assert problems["sock.jsonl"] == ("skipped", "not a regular file (a socket)")
    assert problems["dangling.jsonl"] == ("failed", f"dangling symlink (to {root / 'gone.jsonl'})")
    assert problems["loop-a.jsonl"] == ("failed", "cannot read: Too many levels of symbolic links")
    assert found.problems[0] == SourceProblem(str(root / "dangling.jsonl"), *problems["dangling.jsonl"])
    assert scan([str(root / "pipe.jsonl")]).problems[0].status == "skipped"  # named directly, too


def test_ingest_reads_the_good_files_and_reports_the_rest(folder, tmp_path):
    data, root = folder
    argv = _unprivileged(prl_argv("ingest", str(root), "--store", str(tmp_path / "store"), "--json"))
    res = subprocess.run(argv, env=prl_env(), capture_output=True, text=True, timeout=120)
    summary = json.loads(res.stdout)
    assert res.returncode == summary["exit_code"] == 2, res.stderr  # a file failed: exit 2, after the rest
    files = {os.path.basename(f["uri"]): (f["status"], f["error"]) for f in summary["files"]}
    assert files == {
        "part-0.jsonl": ("ingested", None),
        "pipe.jsonl": ("skipped", "not a regular file (a FIFO)"),
        "sock.jsonl": ("skipped", "not a regular file (a socket)"),
        "dangling.jsonl": ("failed", f"dangling symlink (to {root / 'gone.jsonl'})"),
        "loop-a.jsonl": ("failed", "cannot read: Too many levels of symbolic links"),
        "loop-b.jsonl": ("failed", "cannot read: Too many levels of symbolic links"),
        "secret.jsonl": ("failed", "cannot read: permission denied"),
    }
    assert summary["samples"] == len(data.good)
    again = json.loads(subprocess.run(argv, env=prl_env(), capture_output=True, text=True, timeout=120).stdout)
    assert {os.path.basename(f["uri"]): f["status"] for f in again["files"]}["part-0.jsonl"] == "unchanged"


def test_skipped_entries_alone_do_not_fail_a_run(folder, tmp_path):
    data, root = folder
    for name in ("dangling.jsonl", "loop-a.jsonl", "loop-b.jsonl", "secret.jsonl"):
        (root / name).unlink()
    argv = prl_argv("ingest", str(root), "--store", str(tmp_path / "store"), "--max-quarantine-rate", "1", "--json")
    res = subprocess.run(argv, env=prl_env(), capture_output=True, text=True, timeout=120)
    summary = json.loads(res.stdout)
    assert (res.returncode, summary["samples"]) == (0, len(data.good)), res.stderr
    assert sorted(f["status"] for f in summary["files"]) == ["ingested", "skipped", "skipped"]


def test_side_table_ingest_reports_entries_it_does_not_read(tmp_path):
    from prl.ingestion.side_tables import ingest_side_table

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "r.jsonl").write_text('{"sample_id": "s", "reward": 1}\n')
    os.mkfifo(tmp_path / "in" / "pipe.jsonl")
    result = ingest_side_table([str(tmp_path / "in")], str(tmp_path / "store"), kind="rewards")
    assert (result.rows, result.exit_code) == (1, 0)
    assert result.problems == [
        {"uri": str(tmp_path / "in" / "pipe.jsonl"), "status": "skipped", "reason": "not a regular file (a FIFO)"}
    ]
    os.symlink(tmp_path / "nowhere", tmp_path / "in" / "dangling.jsonl")
    result = ingest_side_table([str(tmp_path / "in")], str(tmp_path / "store"), kind="rewards")
    assert (result.unchanged_files, result.exit_code) == (1, 2)
    assert result.to_json()["problems"][0]["status"] == "failed"


# --- package:NAME in recipes -----------------------------------------------------------------------------------
def test_package_names_resolve_without_running_module_code(tmp_path):
    code = (
        "import sys; from prl.pipeline.recipe import resolve_package_path as r; from prl.errors import UsageError\n"
        "for spec in ('package:this', 'package:this.x', 'package:this/x'):\n"
        "    try: r(spec)\n"
        "    except UsageError as exc: print('refused', exc)\n"
        "print(r('package:prl.templates') == r('package:prl/templates'), 'this' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], env=prl_env(), capture_output=True, text=True, timeout=60)
    lines = res.stdout.splitlines()
    assert lines[:3] == [
        f"refused '{spec}': 'this' is a module, not a package: it has no folder of its own"
        for spec in ("package:this", "package:this.x", "package:this/x")
    ], res.stdout
    assert lines[3:] == ["True False"]  # the Zen of Python was never printed: `this` was not imported


def test_a_recipe_naming_a_module_prints_one_json_object(tmp_path):
    recipe = write_recipe(tmp_path / "r.toml", {"store": {"uri": "s"}, "check": {"tokenizer": "package:this.x"}})
    res = subprocess.run(
        prl_argv("run", str(recipe), "--json"), env=prl_env(), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and len(res.stdout.splitlines()) == 1
    assert "'this' is a module, not a package" in json.loads(res.stdout)["error"]
