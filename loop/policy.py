"""The policy side of the loop: the task, the base model, and the trainer step that reads only what prl published.

The task ("lucky sevens"): a user asks for a number; the reward is 1 when the reply starts with the digit 7,
else 0. The base policy is a tiny random Llama over the DeepSeek vocabulary, warm-started for a few seconds to
answer with digit tokens (so the first digit is 7 about one time in ten, and a group of 8 samples holds a
rewarded one about half the time). The task is verifiable from the reply's text alone, as a production grader
sees it, and its reward rests on one token, the first of the reply: a data-plane fault that misaligns that token
(a loss mask or behaviour logprobs off by one) shows in the curve rather than averaging away.

The trainer step is GRPO's clipped surrogate (Shao et al. 2024; PPO's clip, Schulman et al. 2017) written in
plain torch against :func:`prl.loaders.to_trl_grpo`'s batch: the behaviour logprobs prl kept are the ``old``
logprobs of the ratio (so samples drawn by an older policy are corrected by it), the per-token advantages carry
prl's group-centred score and its k3 KL penalty (``kl = "advantages"``). A plain loss rather than TRL's trainer:
``GRPOTrainer`` generates its own completions; here the data comes from serving, which is the point.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FAULTS = ("advantages", "logprobs", "mask")
"""Data-plane faults :func:`plant` can put in a batch: advantages negated; behaviour logprobs shifted one token
later within each row (each token gets its predecessor's, the first the last's); the loss mask shifted one token
later (the first completion token out, one past the last in)."""

PROMPTS = (
    "Pick a lucky number.",
    "Give me a number, please.",
    "Say a number.",
    "What number comes to mind?",
    "Tell me your favourite number.",
    "Any number will do.",
    "Name a number.",
    "Quick: a number!",
)
REPLY_TOKENS = 4
TARGET = "7"


def reward(text: str) -> float:
    """The task's reward of a reply's text: 1 when it starts with the target digit."""
    return 1.0 if text.lstrip().startswith(TARGET) else 0.0


def digit_ids(model_dir: Path) -> list[int]:
    """The token ids of the ten single digits in the model's tokenizer."""
    vocab = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    return [int(vocab[str(d)]) for d in range(10)]


def prompt_ids(model_dir: Path, prompts: Sequence[str] = PROMPTS) -> list[list[int]]:
    """Each prompt as the server renders it: the chat template with the generation prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    out = []
    for text in prompts:
        rendered: Any = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
        )
        out.append([int(i) for i in rendered["input_ids"]])
    return out


def quiet_transformers() -> None:
    """No progress bar per model saved or loaded (one of each per iteration)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def build_base(folder: Path, seed: int = 0, steps: int = 30) -> Path:
    """policy-v0: a random tiny Llama (``tests.genuine_engines.build_model``) warm-started to reply with digit
    tokens, saved with its tokenizer and chat template."""
    import torch
    from transformers import LlamaForCausalLM

    quiet_transformers()
    from tests.genuine_engines import build_model

    build_model(folder, seed)
    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    digits = torch.tensor(digit_ids(folder))
    prompts = prompt_ids(folder)
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = [rng.choice(prompts) for _ in range(32)]
        width = max(len(p) for p in batch)
        prompt = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        reply = digits[torch.randint(0, 10, (len(batch), REPLY_TOKENS), generator=generator)]
        logps = completion_logprobs(model, prompt, prompt_mask, reply, torch.ones_like(reply))
        loss = -logps.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save(model, folder, folder)
    return folder


def completion_logprobs(model: Any, prompt: Any, prompt_mask: Any, completion: Any, completion_mask: Any) -> Any:
    """The model's logprobs [B, C] of ``completion`` after the left-padded ``prompt``; logits only at the
    positions that predict completion tokens (the vocabulary is 129,280 wide)."""
    import torch

    ids = torch.cat([prompt, completion], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
    width = prompt.shape[1]
    logits = model.lm_head(hidden[:, width - 1 : -1]).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)


def save(model: Any, folder: Path, tokenizer_from: Path) -> Path:
    """The weights as safetensors in ``folder``, beside the tokenizer files of ``tokenizer_from``."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    if folder != tokenizer_from:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tokenizer_from / name, folder / name)
    return folder


def plant(batch: dict[str, Any], fault: str | None) -> dict[str, Any]:
    """``batch`` (a :func:`prl.loaders.to_trl_grpo` batch of torch tensors) with one data-plane fault planted."""
    import torch

    if fault is None:
        return batch
    out = dict(batch)
    if fault == "advantages":
        out["advantages"] = -batch["advantages"]
    elif fault == "logprobs":
        old, mask = batch["old_per_token_logps"], loss_mask(batch)
        lengths = mask.sum(1).long()
        previous = (torch.arange(old.shape[1]).unsqueeze(0) - 1) % lengths.clamp(min=1).unsqueeze(1)
        out["old_per_token_logps"] = torch.where(mask > 0, old.gather(1, previous), old)
    elif fault == "mask":
        mask = loss_mask(batch)
        out["completion_mask"] = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], dim=1)
        out.pop("tool_mask", None)
    else:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
    return out


def grpo_loss(model: Any, batch: dict[str, Any], clip: float = 0.2) -> Any:
    """GRPO's clipped surrogate over the batch's loss-mask tokens (token mean over the batch, as DAPO)."""
    import torch

    logps = completion_logprobs(
        model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"]
    )
    advantages = batch["advantages"]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = torch.exp(logps - batch["old_per_token_logps"])
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    mask = loss_mask(batch)
    return -(surrogate * mask).sum() / mask.sum().clamp(min=1)


def loss_mask(batch: dict[str, Any]) -> Any:
    """TRL's loss mask: ``completion_mask``, times ``tool_mask`` where the batch has one."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


@dataclass
class StepReport:
    """What one training step did: the rows and minibatch updates it took, its mean loss."""

    rows: int
    updates: int
    loss: float


class Trainer:
    """The policy in training: the model, its optimizer (kept across steps), the planted fault."""

    def __init__(self, model_dir: Path, lr: float = 2e-3, epochs: int = 2, minibatch: int = 64, seed: int = 0):
        import torch
        from transformers import LlamaForCausalLM

        torch.manual_seed(seed)
        self.model_dir = model_dir
        self.model = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.epochs, self.minibatch = epochs, minibatch
        self.rng = np.random.default_rng(seed)

    def step(self, set_dir: str, fault: str | None = None) -> StepReport:
        """Train on every row of one published shard set (``epochs`` passes of shuffled minibatches)."""
        import torch

        from prl.loaders import ShardLoader, to_trl_grpo
        from prl.loaders.rows import Rows

        loader = ShardLoader(set_dir, batch_rows=self.minibatch, layout="rows", seed=int(self.rng.integers(1 << 31)))
        rows = updates = 0
        losses = []
        for _ in range(self.epochs):
            for part in loader:
                assert isinstance(part, Rows)
                batch = plant(to_trl_grpo(part, as_torch=True), fault)
                loss = grpo_loss(self.model, batch)
                self.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                rows += part.num_rows
                updates += 1
                losses.append(loss.item())
        return StepReport(rows, updates, float(np.mean(losses)) if losses else 0.0)

    def publish(self, folder: Path) -> Path:
        """The current weights as a model folder the server can load."""
        return save(self.model, folder, self.model_dir)


__all__ = [
    "FAULTS",
    "PROMPTS",
    "StepReport",
    "Trainer",
    "build_base",
    "completion_logprobs",
    "digit_ids",
    "grpo_loss",
    "loss_mask",
    "plant",
    "prompt_ids",
    "reward",
]
