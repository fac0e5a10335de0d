"""The loop's driver: serving, traffic, grading, ``prl run`` as cron calls it, a trainer step, a refit.

Per iteration ``k`` (the server answering with ``policy-vk``):

1. wait until the proxy has answered ``requests`` calls with ``policy-vk`` (traffic never stops: calls made
   while the previous iteration trained were answered by ``policy-v(k-1)``);
2. rotate the proxy's capture into ``traces/`` and grade it: the grader writes one reward event per reply
   (``request_id``, ``choice_index``, ``reward``) into a file of its own under ``rewards/``;
3. ``prl run recipe.toml --json`` (ingest, rewards, check-tokens, score-ref against the frozen ``policy-v0``,
   build-shards with group advantages, k3 KL in the advantages and ``max_staleness``);
4. the trainer reads the set prl published (``prl.loaders``) and takes its step;
5. the new weights go to ``weights/policy-v(k+1)`` and the server loads them in place.

Written to ``loop_out/``: ``iterations.jsonl`` (one line per iteration), ``loop.png`` (reward and KL by
iteration), the store, OUT, the captures and rewards, the server's log. The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loop.policy import FAULTS, PROMPTS, REPLY_TOKENS, Trainer, build_base, reward
from loop.serving import SERVED_NAME, VERSION_HEADER, CaptureProxy, start_policy_server

SAMPLES_PER_PROMPT = 8


@dataclass
class Iteration:
    """One iteration's figures."""

    iteration: int
    version: str
    reward_fresh: float
    """Mean reward of the replies the current policy gave (graded by the task)."""
    fresh_samples: int
    kl: float | None
    """Mean sampled k3 KL to the reference per shipped token (the build's statistics)."""
    shipped: int
    dropped: dict[str, int]
    """Samples this iteration's build dropped for the first time, by reason (a build reconsiders the rows earlier
    builds dropped and counts them again: the difference with the previous build's counts)."""
    staleness: dict[str, int]
    """Replies of the iteration's capture per staleness (0: the current policy's)."""
    seconds: dict[str, float] = field(default_factory=dict)


def recipe(root: Path, max_staleness: int, kl_coef: float) -> str:
    base = root / "weights" / "policy-v0"
    return f"""# written by `python -m loop`: what cron would run every few minutes
[store]
uri = "{root / "store"}"
out = "{root / "shards"}"

[ingest]
sources = ["{root / "traces"}"]

[rewards]
sources = ["{root / "rewards"}"]

[check]
tokenizer = "{base}"

[score_ref]
ref_model = "policy-v0"
model = "{base}"

[shards]
rewards = {{ reward = 1.0 }}
advantage = "mean"
drop_constant_groups = false
kl = "advantages"
kl_estimator = "k3"
kl_coef = {kl_coef}
max_staleness = {max_staleness}
"""


def grade(capture: Path, rewards: Path, current: int) -> tuple[list[float], dict[str, int]]:
    """Write one reward event per reply of ``capture`` to ``rewards`` (a file of its own); the rewards of the
    replies ``policy-v{current}`` gave, and the replies per staleness (``current`` − the version that answered)."""
    fresh: list[float] = []
    staleness: Counter[str] = Counter()
    events = []
    for line in capture.read_text().splitlines():
        record = json.loads(line)
        body = record["response"]["body"]
        if record["response"]["status_code"] != 200 or not isinstance(body, dict):
            continue
        for choice in body.get("choices", []):
            value = reward(choice["message"]["content"] or "")
            events.append({"request_id": body["id"], "choice_index": choice["index"], "reward": value})
            age = current - int(record["request"]["headers"][VERSION_HEADER].rsplit("-v", 1)[1])
            staleness[str(age)] += 1
            if age == 0:
                fresh.append(value)
    rewards.write_text("".join(json.dumps(e) + "\n" for e in events))
    return fresh, dict(sorted(staleness.items()))


def traffic(url: str, stop: threading.Event, seed: int, interval: float, errors: list[str]) -> None:
    """An OpenAI client asking for lucky numbers until ``stop``, a call every ``interval`` seconds (or right
    after the last one when it took longer): ``n`` samples per prompt, logprobs and token IDs returned as vLLM
    offers them."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=5, timeout=300)
    turn = seed
    due = time.monotonic()
    while not stop.wait(max(0.0, due - time.monotonic())):
        due = time.monotonic() + interval
        prompt = PROMPTS[turn % len(PROMPTS)]
        turn += 1
        try:
            client.chat.completions.create(
                model=SERVED_NAME,
                messages=[{"role": "user", "content": prompt}],
                n=SAMPLES_PER_PROMPT,
                max_tokens=REPLY_TOKENS,
                temperature=1.0,
                logprobs=True,
                top_logprobs=1,
                extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
            )
        except Exception as error:  # the loop reports it and stops
            errors.append(repr(error))
            return


def prl_run(recipe_path: Path) -> dict[str, Any]:
    """``prl run RECIPE --json`` as cron runs it; its summary."""
    done = subprocess.run(
        [sys.executable, "-m", "prl", "run", str(recipe_path), "--json"], capture_output=True, text=True, check=False
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"prl run exited {done.returncode}:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout))


def built_sets(summary: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The set folders build-shards published in this run, and its summary."""
    for step in summary.get("steps", []):
        if step.get("step") == "shards":
            shards = step.get("summary") or {}
            return [s["set_dir"] for s in shards.get("sets", [])], shards
    return [], {}


def _new_drops(drops: dict[str, int], seen: Counter[str]) -> dict[str, int]:
    """``drops`` less the counts in ``seen`` (a reason's count never falls: a stale row stays stale); ``seen``
    becomes ``drops``."""
    new = {reason: int(n) - seen[reason] for reason, n in drops.items() if int(n) > seen[reason]}
    seen.clear()
    seen.update({reason: int(n) for reason, n in drops.items()})
    return new


def plot(rows: list[Iteration], path: Path, fault: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, reward_axis = plt.subplots(figsize=(7, 4))
    steps = [r.iteration for r in rows]
    reward_axis.plot(steps, [r.reward_fresh for r in rows], "o-", color="tab:green", label="reward (fresh traffic)")
    reward_axis.set_xlabel("iteration")
    reward_axis.set_ylabel("reward mean")
    reward_axis.set_ylim(-0.02, 1.02)
    kl_axis = reward_axis.twinx()
    kl_axis.plot(
        steps,
        [r.kl if r.kl is not None else float("nan") for r in rows],
        "s--",
        color="tab:purple",
        label="KL to policy-v0",
    )
    kl_axis.set_ylabel("sampled k3 KL")
    lines = reward_axis.get_lines() + kl_axis.get_lines()
    reward_axis.legend(lines, [str(line.get_label()) for line in lines], loc="lower right")
    reward_axis.set_title(f"prl loop: lucky sevens{f' (fault: {fault})' if fault else ''}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run_loop(
    root: Path,
    iterations: int = 12,
    requests: int = 12,
    fault: str | None = None,
    max_staleness: int = 0,
    kl_coef: float = 0.05,
    seed: int = 0,
    rate: float = 1.0,
) -> dict[str, Any]:
    """The whole loop (see the module docstring); the final JSON object."""
    started = time.monotonic()
    shutil.rmtree(root, ignore_errors=True)
    for name in ("traces", "rewards", "weights"):
        (root / name).mkdir(parents=True)
    base = build_base(root / "weights" / "policy-v0", seed)
    recipe_path = root / "recipe.toml"
    recipe_path.write_text(recipe(root.resolve(), max_staleness, kl_coef))
    server = start_policy_server(base, root / "vllm.log")
    trainer = Trainer(base, seed=seed)
    rows: list[Iteration] = []
    stop = threading.Event()
    errors: list[str] = []
    seen_drops: Counter[str] = Counter()
    log = (root / "iterations.jsonl").open("w")
    try:
        with CaptureProxy(server.url, root / "live" / "capture.jsonl", root / "traces", "policy-v0") as proxy:
            clients = [
                threading.Thread(target=traffic, args=(proxy.url, stop, i, 2 / rate, errors), daemon=True)
                for i in range(2)
            ]
            for client in clients:
                client.start()
            for k in range(iterations):
                version = f"policy-v{k}"
                t0 = time.monotonic()
                while proxy.answered[version] < requests and not errors:
                    time.sleep(0.2)
                if errors:
                    raise RuntimeError(f"the traffic stopped: {errors[0]}")
                capture = proxy.rotate()
                assert capture is not None
                fresh, staleness = grade(capture, root / "rewards" / capture.name, k)
                t1 = time.monotonic()
                summary = prl_run(recipe_path)
                sets, shards = built_sets(summary)
                t2 = time.monotonic()
                updates = sum(trainer.step(set_dir, fault).updates for set_dir in sets)
                t3 = time.monotonic()
                weights = trainer.publish(root / "weights" / f"policy-v{k + 1}")
                held = proxy.refit(weights, f"policy-v{k + 1}")
                statistics = shards.get("statistics") or {}
                row = Iteration(
                    iteration=k,
                    version=version,
                    reward_fresh=sum(fresh) / len(fresh) if fresh else 0.0,
                    fresh_samples=len(fresh),
                    kl=(statistics.get("kl") or {}).get("mean_per_token"),
                    shipped=int(shards.get("rows", 0)),
                    dropped=_new_drops(shards.get("drops") or {}, seen_drops),
                    staleness=staleness,
                    seconds={
                        "traffic": round(t1 - t0, 2),
                        "prl": round(t2 - t1, 2),
                        "train": round(t3 - t2, 2),
                        "refit": round(held, 2),
                        **{f"prl {s['step']}": round(s["seconds"], 2) for s in summary.get("steps", [])},
                    },
                )
                rows.append(row)
                log.write(json.dumps(asdict(row)) + "\n")
                log.flush()
                print(
                    f"iteration {k}: {version} reward {row.reward_fresh:.3f} ({row.fresh_samples} fresh), "
                    f"kl {row.kl if row.kl is None else round(row.kl, 4)}, shipped {row.shipped}, dropped "
                    f"{row.dropped}, updates {updates}, seconds {row.seconds}",
                    file=sys.stderr,
                    flush=True,
                )
            stop.set()
    finally:
        stop.set()
        log.close()
        server.stop()
    plot(rows, root / "loop.png", fault)
    drops: Counter[str] = Counter()
    for row in rows:
        drops.update(row.dropped)
    return {
        "iterations": len(rows),
        "reward_first": round(rows[0].reward_fresh, 4),
        "reward_last": round(rows[-1].reward_fresh, 4),
        "kl_last": None if rows[-1].kl is None else round(rows[-1].kl, 5),
        "samples_shipped": sum(r.shipped for r in rows),
        "stale_dropped": drops["stale"],
        "seconds": round(time.monotonic() - started, 1),
        "fault": fault,
    }


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="loop_out", help="the loop's folder (emptied first)")
    parser.add_argument("--iterations", type=_positive(int), default=int(os.environ.get("ITERATIONS", "12")))
    parser.add_argument(
        "--requests", type=_positive(int), default=12, help="fresh calls per iteration (8 replies each)"
    )
    parser.add_argument(
        "--rate", type=_positive(float), default=1.0, help="calls per second from the two clients together"
    )
    parser.add_argument("--fault", choices=FAULTS, default=os.environ.get("FAULT") or None)
    parser.add_argument("--max-staleness", type=int, default=0)
    parser.add_argument("--kl-coef", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = run_loop(
        Path(args.out),
        args.iterations,
        args.requests,
        args.fault,
        args.max_staleness,
        args.kl_coef,
        args.seed,
        args.rate,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
