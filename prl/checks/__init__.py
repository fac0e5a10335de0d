"""Token checks: does a sample's token data say what the model saw and sampled?

``check_tokens(store, tokenizer, ...)`` runs every check family on the traces table and appends one
verdict per sample to ``STORE/checks``. One module per family (``vocab``, ``logprobs``, ``roundtrip``,
``template``, ``prefix``, ``special``, ``heads``); ``verdict`` maps reason codes to verdicts; ``report``
renders a result.
"""

from prl.checks.options import CheckOptions
from prl.checks.result import CheckResult, Example
from prl.checks.run import check_tokens
from prl.checks.tokenizer import CheckTokenizer

__all__ = ["CheckOptions", "CheckResult", "CheckTokenizer", "Example", "check_tokens"]
