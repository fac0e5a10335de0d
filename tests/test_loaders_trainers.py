"""The adapters' batches through the trainers' own loss code (TRL's ``GRPOTrainer._compute_loss``, verl's
``ppo_loss``), and the recorded values of those runs.

The ``genuine`` tests need the trainers' virtualenv (``make trainers-venv``; run them with its python) and skip
with the reason otherwise. The others compare the adapters' batches today with the ones the trainers were run on
(``tests/fixtures/trainers/recorded.json``, written by ``python -m tests.trainer_losses`` in that virtualenv), and the
documented loss formulas with the losses the trainers computed.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from prl.loaders import TemperatureWarning, to_trl_grpo, to_verl
from tests.trainer_losses import RECORDED, TRL_CASES, VERL_CASES, policy_logps, sample_rows


def recorded() -> dict:
    with open(RECORDED) as f:
        return json.load(f)


def trl_inputs(case: dict, as_torch: bool, recomputed: np.ndarray) -> dict:
    kw = dict(case["adapter"])
    if kw.pop("recomputed", False):
        kw["old_per_token_logps"] = recomputed
    return to_trl_grpo(sample_rows(), as_torch=as_torch, **kw)


def dapo_loss(inputs: dict, policy: np.ndarray, num_processes: int, eps_low: float, eps_high: float) -> float:
    """TRL's dapo loss as its module docstring states it: clipped PPO ratio to the old logprobs, times the
    importance sampling ratio, summed over the loss mask, over num_items_in_batch / num_processes (float64)."""
    mask = np.asarray(inputs["completion_mask"], np.float64)
    if "tool_mask" in inputs:
        mask = mask * np.asarray(inputs["tool_mask"])
    adv = np.asarray(inputs["advantages"], np.float64)
    adv = adv[:, None] if adv.ndim == 1 else adv
    ratio = np.exp(np.asarray(policy, np.float64) - np.asarray(inputs["old_per_token_logps"], np.float64))
    clipped = np.clip(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -np.minimum(ratio * adv, clipped * adv) * np.asarray(inputs["importance_sampling_ratio"])
    return float((per_token * mask).sum() / (float(np.asarray(inputs["num_items_in_batch"])) / num_processes))


# --- against the recorded runs (no trainer needed) ------------------------------------------------------------
def test_recorded_runs_name_their_versions_and_cases():
    rec = recorded()
    assert (rec["trl"], rec["verl"]) == ("1.16.0", "0.9.1")
    assert [{k: c[k] for k in ("adapter", "config", "num_processes")} for c in rec["trl_cases"]] == TRL_CASES
    assert [{"actor": c["actor"]} for c in rec["verl_cases"]] == VERL_CASES
    assert all(c["loss_shape"] == [] for c in rec["trl_cases"])  # a 0-d loss, as TRL's own batches give


def test_trl_batches_are_the_recorded_ones():
    rec = recorded()
    recomputed = np.asarray(rec["recomputed_logps"], np.float32)
    for case in rec["trl_cases"]:
        inputs = trl_inputs(case, False, recomputed)
        assert {k: v.tolist() for k, v in inputs.items()} == case["inputs"], case["adapter"]
    plain = to_trl_grpo(sample_rows())
    assert (
        policy_logps(plain["completion_ids"].shape, plain["sampling_per_token_logps"]).tolist() == rec["policy_logps"]
    )


def test_trl_dapo_losses_are_the_recorded_ones():
    rec = recorded()
    policy = np.asarray(rec["policy_logps"], np.float32)
    dapo = [c for c in rec["trl_cases"] if c["config"]["loss_type"] == "dapo"]
    assert len(dapo) == 3
    for case in dapo:
        got = dapo_loss(case["inputs"], policy, case["num_processes"], case["epsilon"], case["epsilon_high"])
        assert got == pytest.approx(case["loss"], rel=1e-6, abs=1e-7), case["adapter"]
    one, two = dapo[0], dapo[1]
    # one of two processes, told the gathered 12: TRL divides its 6 tokens' sum by 12 / 2, as the lone process
    # divides the same sum by its 6
    assert one["inputs"]["num_items_in_batch"] == 6 and two["inputs"]["num_items_in_batch"] == 12
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)


def test_verl_batch_and_losses_are_the_recorded_ones():
    rec = recorded()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rows record one temperature: no warning
        batch = to_verl(sample_rows())
    assert {k: v.tolist() for k, v in batch.tensors.items()} == rec["verl_tensors"]
    assert batch.meta_info == {"pad_token_id": 0, "temperature": 0.7}
    for case in rec["verl_cases"]:
        assert case["temperature"] == pytest.approx(0.7) and case["meta_info"]["temperature"] == 0.7
    # token-mean vanilla PPO over response_mask, as ppo_loss computes it (clip 0.2, no IS weights)
    policy = np.asarray(rec["verl_policy_logps"], np.float64)
    t = batch.tensors
    ratio = np.exp(policy - t["old_log_probs"])
    adv = t["advantages"].astype(np.float64)
    per_token = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2))
    mask = t["response_mask"].astype(np.float64)
    token_mean = float((per_token * mask).sum() / mask.sum())
    assert rec["verl_cases"][0]["loss"] == pytest.approx(token_mean, rel=1e-6)


# --- the trainers' own code (their virtualenv) ------------------------------------------------------------------
@pytest.fixture(scope="module")
def trl():
    return pytest.importorskip("trl", reason="TRL is not installed: `make trainers-venv`, then run with its python")


@pytest.fixture(scope="module")
def verl():
    return pytest.importorskip("verl", reason="verl is not installed: `make trainers-venv`, then run with its python")


@pytest.mark.genuine
def test_trl_compute_loss_gives_the_recorded_losses(trl):
    from tests.trainer_losses import trl_loss

    rec = recorded()
    policy = np.asarray(rec["policy_logps"], np.float32)
    recomputed = np.asarray(rec["recomputed_logps"], np.float32)
    for case in rec["trl_cases"]:
        loss = trl_loss(trl_inputs(case, True, recomputed), policy, case["num_processes"], **case["config"])
        assert loss.shape == ()  # TRL's dapo loss is 0-d on the adapter's batch
        assert float(loss) == pytest.approx(case["loss"], rel=1e-6, abs=1e-7), case


@pytest.mark.genuine
def test_trl_loss_over_processes_is_the_one_process_loss(trl):
    """Split the batch over two processes, each told the gathered count: the mean of their losses (what DDP's
    gradient averaging applies) is the one-process loss, for TRL's dapo loss with IS correction on."""
    import torch

    from tests.trainer_losses import trl_loss

    rows = sample_rows()
    whole = to_trl_grpo(rows, as_torch=True)
    policy = policy_logps(tuple(whole["completion_ids"].shape), whole["sampling_per_token_logps"].numpy())
    one = trl_loss(whole, policy, 1, loss_type="dapo", use_vllm=True)
    parts, counts = [rows.take(np.array([0, 1])), rows.take(np.array([2]))], []
    for part in parts:
        counts.append(int(part.loss_mask_C.sum()))
    losses = []
    for part, first in zip(parts, (0, 2), strict=True):
        inputs = to_trl_grpo(part, as_torch=True, num_items_in_batch=sum(counts), world_size=2)
        width = inputs["completion_ids"].shape[1]
        losses.append(
            trl_loss(inputs, policy[first : first + part.num_rows, :width], 2, loss_type="dapo", use_vllm=True)
        )
    assert float(torch.stack(losses).mean()) == pytest.approx(float(one), rel=1e-6)


@pytest.mark.genuine
def test_trl_vllm_importance_sampling_needs_no_extra_key(trl):
    from tests.trainer_losses import trl_loss

    inputs = to_trl_grpo(sample_rows(), as_torch=True)
    policy = policy_logps(tuple(inputs["completion_ids"].shape), inputs["sampling_per_token_logps"].numpy())
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        batch = to_trl_grpo(sample_rows(), as_torch=True, importance_sampling_mode=mode)
        loss = trl_loss(batch, policy, 1, loss_type="grpo", use_vllm=True, vllm_importance_sampling_mode=mode)
        assert loss.shape == () and bool(loss.isfinite())


@pytest.mark.genuine
def test_verl_ppo_loss_gives_the_recorded_losses_and_reads_the_temperature(verl):
    from tests.trainer_losses import verl_loss

    rec = recorded()
    batch = to_verl(sample_rows(), as_torch=True)
    policy = np.asarray(rec["verl_policy_logps"], np.float32)
    for case in rec["verl_cases"]:
        loss, td = verl_loss(batch, policy, **case["actor"])
        assert float(loss) == pytest.approx(case["loss"], rel=1e-6, abs=1e-7), case
        assert td["temperature"] == 0.7  # what the engine scales the logits by
    rows = sample_rows()
    rows.temperature_N = np.array([0.7, np.nan, 0.7], dtype=np.float32)
    with pytest.warns(TemperatureWarning, match="1 of 3 rows record no sampling temperature"):
        unknown = to_verl(rows, as_torch=True)
    loss, td = verl_loss(unknown, policy, loss_agg_mode="token-mean")
    assert td["temperature"] == 1.0 and float(loss) == pytest.approx(rec["verl_cases"][0]["loss"], rel=1e-6)
