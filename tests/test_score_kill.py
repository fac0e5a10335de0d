"""``prl score-ref`` SIGKILLed after its first committed batch: the rerun scores exactly the rest, once each.

The killed run is a process of its own; the rerun runs the same command in this process (torch and the model's
library are imported here already), its exit code and JSON summary read from the CLI runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from prl.cli import app
from tests.pipeline_helpers import prl_argv, prl_env
from tests.score_helpers import Reference, build_tiny_model, traces_store

pytestmark = pytest.mark.campaign  # long: `make test-all`

pytest.importorskip("torch")


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_finishes_without_duplicates(tmp_path):
    folder = build_tiny_model(tmp_path / "model")
    store, samples = traces_store(tmp_path, 40, seed=6)
    args = ["score-ref", "--store", store.uri, "--ref-model", "tiny", "--model", str(folder), "--batch-tokens", "40"]
    proc = subprocess.Popen(prl_argv(*args), env=prl_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        log = tmp_path / "store" / "ref_logprobs" / "_delta_log"
        while time.monotonic() < deadline and proc.poll() is None:
            if (log / f"{2:020d}.json").exists():  # table created (0) and two batches committed
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    partial = store.read("ref_logprobs", columns=["sample_id"]).column("sample_id").to_pylist()
    assert 0 < len(partial) < len(samples)
    rerun = CliRunner().invoke(app, [*args, "--json"])
    assert rerun.exit_code == 0, rerun.output
    assert json.loads(rerun.stdout)["scored"] == len(samples) - len(partial)
    table = store.read("ref_logprobs", columns=["sample_id", "ref_logprobs"])
    ids = table.column("sample_id").to_pylist()
    assert sorted(ids) == sorted(samples)  # every sample exactly once
    ref = Reference(folder)
    for sample_id, values in zip(ids, table.column("ref_logprobs").to_pylist(), strict=True):
        np.testing.assert_allclose(values, ref.completion(*samples[sample_id]), atol=1e-5, rtol=0)
