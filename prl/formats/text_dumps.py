"""Text-only rollout dumps of RL frameworks: recognised, so they are not "unknown format", and quarantined as
``no_token_ids`` (their text was decoded from tokens; re-encoding it would not give back the sampled tokens):

* verl ``RayPPOTrainer._dump_generations`` (``verl/trainer/ppo/ray_trainer.py``; ``trainer.rollout_data_dir`` /
  ``validation_data_dir``): ``{"input": str, "output": str, "gts": ..., "score": float, "step": int, ...}``;
* SkyRL ``dump_per_dataset_eval_results`` (``skyrl/train/utils/trainer_utils.py``; eval dumps):
  ``{"input_prompt": str, "output_response": str, "score": ..., "stop_reason": ..., "env_class": ...,
  "env_extras": ..., "data_source": ...}``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from prl.formats.base import Format, ParseOptions, Quarantined, Sample


def _verl(obj: dict[str, Any]) -> bool:
    return isinstance(obj.get("input"), str) and isinstance(obj.get("output"), str) and "score" in obj and "step" in obj


def _skyrl(obj: dict[str, Any]) -> bool:
    return isinstance(obj.get("input_prompt"), str) and isinstance(obj.get("output_response"), str) and "score" in obj


class TextDump(Format):
    """verl ``_dump_generations`` and SkyRL eval dumps: decoded text only, quarantined as ``no_token_ids``."""

    name: ClassVar[str] = "rl_text_dump"
    description: ClassVar[str] = "verl _dump_generations / SkyRL eval dumps: text only (quarantined)"

    def detect(self, obj: Any) -> bool:
        return isinstance(obj, dict) and (_verl(obj) or _skyrl(obj))

    def parse(self, obj: Any, options: ParseOptions) -> list[Sample | Quarantined]:
        writer = "verl _dump_generations" if isinstance(obj, dict) and _verl(obj) else "SkyRL eval dump"
        raise Quarantined(
            "no_token_ids",
            f"a {writer} record holds decoded text, not the sampled token IDs; text is never retokenized "
            "(keep the rollout's token IDs, e.g. prompt_ids/response_ids, instead)",
        )
