"""logprobs, heads and special checks on planted cases, with the real DeepSeek-V4 tokenizer."""

from __future__ import annotations

import math

from prl.checks import check_tokens
from tests.checks_helpers import EOS, chat_prompt, enc, make_store, row, tokenizer_dir

PROMPT = chat_prompt("Count to five")
COMPLETION = [*enc("one two three four five six seven eight"), EOS]
N = len(COMPLETION)


def run(tmp_path, rows, **kwargs):
    store = make_store(tmp_path, rows)
    result = check_tokens(store, tokenizer_dir(), **kwargs)
    got = {r["sample_id"]: r for r in store.read("checks").to_pylist()}
    return result, got


def brief(r):
    return r["verdict"], r["reasons"], r["first_divergence"]


def lps(n=N, value=-0.5):
    return [value] * n


def test_logprob_checks(tmp_path):
    low = lps()
    low[2] = low[4] = low[6] = -18.0
    zeros = lps()
    zeros[1:] = [0.0] * (N - 1)
    rows = [
        row("clean", PROMPT, COMPLETION),
        row("off_by_one", PROMPT, COMPLETION, lps(N + 1)),
        row("short", PROMPT, COMPLETION, lps(N - 1)),
        row("nan", PROMPT, COMPLETION, [*lps(3), math.nan, *lps(N - 4)]),
        row("positive", PROMPT, COMPLETION, [*lps(5), 0.5, *lps(N - 6)]),
        row("missing", PROMPT, COMPLETION, [*lps(2), None, *lps(N - 3)]),
        row("zeros", PROMPT, COMPLETION, zeros),
        row("greedy_zeros", PROMPT, COMPLETION, zeros, temperature=0.0),
        row("retokenized", PROMPT, COMPLETION, low),
        row("one_confident_zero", PROMPT, COMPLETION, [*lps(4), 0.0, *lps(N - 5)]),
    ]
    result, got = run(tmp_path, rows)
    assert brief(got["clean"]) == ("ok", [], None)
    assert brief(got["off_by_one"]) == ("invalid", ["logprob_count"], N)
    assert brief(got["short"]) == ("invalid", ["logprob_count"], N - 1)
    assert brief(got["nan"]) == ("invalid", ["logprob_nonfinite"], 3)
    assert brief(got["positive"]) == ("invalid", ["logprob_positive"], 5)
    assert brief(got["missing"]) == ("invalid", ["logprob_missing"], 2)
    assert brief(got["zeros"]) == ("drift", ["logprob_placeholder"], 1)
    assert brief(got["greedy_zeros"]) == ("ok", [], None)
    assert brief(got["retokenized"]) == ("drift", ["logprob_low"], 2)
    assert brief(got["one_confident_zero"]) == ("ok", [], None)
    assert result.verdicts == {"ok": 3, "note": 0, "warn": 0, "drift": 2, "invalid": 5}
    assert result.checks["logprobs"] == 7


def test_masked_tool_tokens_may_carry_placeholder_zeros(tmp_path):
    tool = enc("<｜tool▁outputs▁begin｜>sunny, 21C<｜tool▁outputs▁end｜>")
    answer = [*enc("It is sunny."), EOS]
    completion = enc("Checking.") + tool + answer
    mask = [True] * len(enc("Checking.")) + [False] * len(tool) + [True] * len(answer)
    logprobs = [-0.3 if m else 0.0 for m in mask]
    _, got = run(tmp_path, [row("stitched", PROMPT, completion, logprobs, completion_mask=mask)])
    assert brief(got["stitched"]) == ("ok", [], None)


def test_mask_of_wrong_length_is_invalid(tmp_path):
    _, got = run(tmp_path, [row("m", PROMPT, COMPLETION, completion_mask=[True] * (N - 2))])
    assert brief(got["m"]) == ("invalid", ["mask_count"], N - 2)


def test_special_token_checks(tmp_path):
    no_eos = COMPLETION[:-1]
    stray = [*COMPLETION[:3], 2, *COMPLETION[3:]]  # <｜▁pad▁｜> is special=True
    rows = [
        row("no_stop", PROMPT, no_eos, lps(N - 1)),
        row("length_ok", PROMPT, no_eos, lps(N - 1), finish_reason="length"),
        row("eot", PROMPT, [*no_eos, 128805], lps(N)),  # <|EOT|> ends a turn too
        row("stray", PROMPT, stray, lps(N + 1)),
    ]
    _, got = run(tmp_path, rows)
    assert brief(got["no_stop"]) == ("note", ["special_no_stop"], N - 2)
    assert brief(got["length_ok"]) == ("ok", [], None)
    assert brief(got["eot"]) == ("ok", [], None)
    assert brief(got["stray"]) == ("note", ["special_mid_completion"], 3)


def heads_for(completion, logprobs, k=3):
    """A consistent top-k head: the sampled token first, then two others with lower logprobs."""
    ids, lp = [], []
    for t, q in zip(completion, logprobs, strict=True):
        others = [x for x in (100, 200, 300, 400) if x != t][: k - 1]
        ids.append([t, *others])
        lp.append([q, q - 3.0, q - 4.0][:k])
    return ids, lp


def test_head_checks(tmp_path):
    logprobs = [-0.1 * (i + 1) for i in range(N)]
    ids, lp = heads_for(COMPLETION, logprobs)
    shifted_ids, shifted_lp = ids[1:] + ids[:1], lp[1:] + lp[:1]
    uniform = -math.log(129280)
    degenerate_ids = [list(h) for h in ids]
    degenerate_lp = [list(h) for h in lp]
    degenerate_ids[4], degenerate_lp[4] = [0, 1, 2], [uniform] * 3
    unsorted_lp = [list(h) for h in lp]
    unsorted_lp[2] = [lp[2][0], lp[2][2], lp[2][1]]
    dup_ids = [list(h) for h in ids]
    dup_ids[1] = [ids[1][0], ids[1][1], ids[1][1]]
    mass_lp = [list(h) for h in lp]
    mass_lp[3] = [-0.1, -0.2, -0.3]
    mass_ids = [list(h) for h in ids]
    mass_ids[3] = [COMPLETION[3], 100, 200]
    mass_logprobs = list(logprobs)
    mass_logprobs[3] = -0.1
    varies_ids = [list(h) for h in ids]
    varies_lp = [list(h) for h in lp]
    varies_ids[5], varies_lp[5] = varies_ids[5][:2], varies_lp[5][:2]
    rows = [
        row("good", PROMPT, COMPLETION, logprobs, topk_ids=ids, topk_logprobs=lp),
        row("misaligned", PROMPT, COMPLETION, logprobs, topk_ids=shifted_ids, topk_logprobs=shifted_lp),
        row("degenerate", PROMPT, COMPLETION, logprobs, topk_ids=degenerate_ids, topk_logprobs=degenerate_lp),
        row("unsorted", PROMPT, COMPLETION, logprobs, topk_ids=ids, topk_logprobs=unsorted_lp),
        row("duplicate", PROMPT, COMPLETION, logprobs, topk_ids=dup_ids, topk_logprobs=lp),
        row("mass", PROMPT, COMPLETION, mass_logprobs, topk_ids=mass_ids, topk_logprobs=mass_lp),
        row("k_varies", PROMPT, COMPLETION, logprobs, topk_ids=varies_ids, topk_logprobs=varies_lp),
        row("short", PROMPT, COMPLETION, logprobs, topk_ids=ids[:-1], topk_logprobs=lp[:-1]),
        row(
            "out_of_vocab",
            PROMPT,
            COMPLETION,
            logprobs,
            topk_ids=[ids[0], [ids[1][0], 129280, 5], *ids[2:]],
            topk_logprobs=lp,
        ),
        row("no_heads", PROMPT, COMPLETION, logprobs),
    ]
    _, got = run(tmp_path, rows)
    assert brief(got["good"]) == ("ok", [], None) and got["good"]["heads_ok"] is True
    assert brief(got["misaligned"]) == ("invalid", ["heads_misaligned"], 0)
    assert got["misaligned"]["heads_ok"] is False
    assert brief(got["degenerate"]) == ("invalid", ["heads_misaligned", "heads_degenerate"], 4)
    assert brief(got["unsorted"]) == ("invalid", ["heads_not_sorted"], 2)
    assert brief(got["duplicate"]) == ("invalid", ["heads_id_duplicate"], 1)
    assert brief(got["mass"]) == ("invalid", ["heads_mass"], 3)
    assert brief(got["k_varies"]) == ("invalid", ["heads_k_varies"], 5)
    assert brief(got["short"]) == ("invalid", ["heads_shape"], None)
    assert brief(got["out_of_vocab"]) == ("invalid", ["heads_id_range"], 1)
    assert brief(got["no_heads"]) == ("ok", [], None) and got["no_heads"]["heads_ok"] is None
