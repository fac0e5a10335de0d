"""The multi-agent session of prl's sample data: ``traces/multi_agent_capture.jsonl``.

A planner and a worker share one session; a logging proxy captured their calls as ``{request, response}`` pairs,
interleaved as they happened. Every response's ``created`` is the same whole second (OpenAI-style, one-second
resolution); the proxy's ``timestamp`` on each pair has milliseconds, so the calls are ordered by it. The planner
names itself in request ``metadata.agent_id`` (as LiteLLM's proxy records it), the worker in an
``X-LiteLLM-Agent-Id`` header; neither call carries a turn index.

The worker's second answer has reasoning; its client renders the history with ``deepseek_v4.jinja``, which drops
earlier reasoning, so the worker's third call is a FORK (a new trajectory starts there) and its fourth extends the
third cleanly. The planner's calls extend each other cleanly throughout.
"""

from __future__ import annotations

from typing import Any

PLANNER = [
    (
        "Plan a three-day trip to Lisbon for two people in May.",
        None,
        "Day 1: Alfama and the castle. Day 2: Belém. Day 3: Sintra.",
    ),
    ("The worker booked the hotel. What is next?", None, "Book the Sintra train tickets and a dinner table for day 2."),
    ("Both are booked. Anything left?", None, "Nothing left: send the itinerary to both travellers."),
]
WORKER = [
    (
        "Find a hotel in Alfama for 12 to 15 May, under 180 euros a night.",
        None,
        "Casa Alfama: 165 euros a night, breakfast included.",
    ),
    (
        "Book it for two guests.",
        "The price is under the limit and the dates are free, so booking it is fine.",
        "Booked: Casa Alfama, 12 to 15 May, two guests, confirmation LX-4417.",
    ),
    ("Now book the 9:10 train to Sintra on 14 May.", None, "Booked: two seats on the 9:10 from Rossio, 14 May."),
    ("And a table for two at 20:00 on 13 May near Belém.", None, "Booked: a table for two at 20:00, Belém, 13 May."),
]
ORDER = [("planner", 0), ("worker", 0), ("worker", 1), ("planner", 1), ("worker", 2), ("worker", 3), ("planner", 2)]
"""The calls in the order they happened."""


def multi_agent(w: Any, sampler: Any, m: Any) -> None:
    """Write ``traces/multi_agent_capture.jsonl`` with ``w`` (the generator's ``Writer``), drawing completions from
    ``sampler``; ``m`` is the generator module (wire shapes, constants)."""
    sid = f"sess-multi-{sampler.hex(12)}"
    created = m.BASE_TS + 21600
    history = {
        "planner": [{"role": "system", "content": "You plan trips."}],
        "worker": [{"role": "system", "content": "You book."}],
    }
    scripts = {"planner": PLANNER, "worker": WORKER}
    records, facts = [], {"session_id": sid, "calls": [], "samples": 0}
    for n, (agent, i) in enumerate(ORDER):
        user, reasoning, answer = scripts[agent][i]
        msgs = [*history[agent], {"role": "user", "content": user}]
        c = sampler.complete(reasoning, answer)
        req_id = f"chatcmpl-{sampler.hex()}"
        request: dict[str, Any] = {
            "model": m.MODEL,
            "messages": msgs,
            "temperature": 1.0,
            "top_p": 1.0,
            "logprobs": True,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "metadata": {"session_id": sid},
        }
        headers = {"Content-Type": "application/json"}
        if agent == "planner":
            request["metadata"]["agent_id"] = "planner"
        else:
            headers["X-LiteLLM-Agent-Id"] = "worker"
        millis = 37 + 131 * n
        records.append(
            {
                "timestamp": m.iso(created + millis / 1000.0),
                "request": {"method": "POST", "url": "/v1/chat/completions", "headers": headers, "body": request},
                "response": {
                    "status_code": 200,
                    "body": m.vllm_chat_body(req_id, created, w.tok.prompt_ids(msgs), [c]),
                },
            }
        )
        history[agent] = [*msgs, m.assistant_message(c)]
        w.rewardable.append((req_id, 0, c, "multi_agent_capture"))
        facts["calls"].append(f"{agent}{i}")
        facts["samples"] += 1
    w.write_jsonl("traces/multi_agent_capture.jsonl", records)
    w.facts["multi_agent_capture"] = {**facts, "records": len(records)}
