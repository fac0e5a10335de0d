"""The package-level library API: every name resolves to the function the CLI calls."""

from __future__ import annotations

import subprocess
import sys

import prl


def test_api_names_resolve_to_library_functions():
    from prl.checks import check_tokens
    from prl.ingestion.traces import ingest
    from prl.shards.build import build_shards

    assert prl.ingest is ingest
    assert prl.check_tokens is check_tokens
    assert prl.build_shards is build_shards
    assert set(prl.__all__) >= {"ingest", "check_tokens", "build_shards", "run", "inspect", "verify_shards"}


def test_import_is_lazy():
    code = "import sys, prl; print('pyarrow' in sys.modules, 'deltalake' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_library_ingest_through_the_package(tmp_path):
    from tests.conftest import write_lines
    from tests.records import vllm_chat

    path = write_lines(tmp_path / "a.jsonl", [vllm_chat("api", [1, 2], [([3], [-0.5])])])
    result = prl.ingest([str(path)], str(tmp_path / "store"))
    assert (result.samples, result.exit_code) == (1, 0)
