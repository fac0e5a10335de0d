"""Reference logprobs (``prl score-ref``): log p_ref of every sampled token, computed from the token IDs.

Backends, one module each, all answering :class:`prl.score.base.Backend`:

- :mod:`prl.score.vllm` — a vLLM ``/v1/completions`` endpoint (token-ID prompt, ``prompt_logprobs``);
- :mod:`prl.score.sglang` — an SGLang ``/generate`` endpoint (``input_ids``, ``return_logprob``);
- :mod:`prl.score.tinker` — a Tinker service through the ``tinker`` SDK (``SamplingClient.compute_logprobs``; the
  ``prl[tinker]`` extra);
- :mod:`prl.score.local` — a local transformers model folder (the ``prl[ref]`` extra: torch).

:func:`prl.score.run.score_ref` drives them: it picks the samples of ``traces`` that have no ``ref_logprobs`` row
for the ``ref_model`` yet, scores them batch by batch and commits each batch atomically.
"""

from __future__ import annotations

from prl.score.run import ScoreResult, score_ref

__all__ = ["ScoreResult", "score_ref"]
