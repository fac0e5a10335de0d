"""Inputs of the kill harness (:mod:`tests.crash_harness`) that grow between runs, with what each line must become.

:class:`TraceInput` grows vLLM trace files (:class:`tests.pipeline_helpers.GrowingInput`) and now and then leaves
a file's last line unfinished, as a writer still writing it would; :class:`RewardInput` grows a reward JSONL file
with lines of every accepted shape (one event or several per line, stamped or not, exact repeats of an earlier
line, which are events of their own), bad lines, and now and then an unfinished last line. A line still being
written belongs in neither the table nor quarantine until it is finished.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from tests.pipeline_helpers import GrowingInput


@dataclass
class Unfinished:
    """The rest of a cut last line (``path`` holds the line up to the cut) and what the line becomes once whole."""

    path: Path
    rest: str
    good: set[str] = field(default_factory=set)
    bad: set[tuple[str, int]] = field(default_factory=set)
    events: list[tuple[str, int, str, str, float]] = field(default_factory=list)

    def finish(self) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(self.rest)


class HoldsUnfinished:
    """An input whose last line may be cut (``pending``): :meth:`finish_line` writes the rest of it."""

    pending: Unfinished | None

    def finish_line(self) -> bool:
        """Finish the unfinished line (True when there was one)."""
        if self.pending is None:
            return False
        self.pending.finish()
        self.pending = None
        return True


def cut_last_line(path: Path, rng: random.Random) -> tuple[str, str, int]:
    """Cut ``path``'s last line at a random byte past its first (the newline or more goes): ``(last line, rest cut
    off, its line number)``."""
    text = path.read_text(encoding="utf-8")
    last = text.rstrip("\n").rsplit("\n", 1)[-1] + "\n"
    cut = len(text) - len(last) + rng.randint(1, len(last) - 1)
    with open(path, "r+", encoding="utf-8") as fh:
        fh.truncate(cut)
    return last, text[cut:], text.count("\n")


ROTATE = 4
"""Growths a file takes before the writer moves on to new files (as a rotating log does): a grown file is read
again whole, so ever-growing files would make each run cost the whole history."""


class TraceInput(GrowingInput, HoldsUnfinished):
    """:class:`GrowingInput` whose files rotate every :data:`ROTATE` growths (``traces/part-G-I.jsonl`` and
    ``rewards/rewards-G.jsonl``), and whose ``expected_*`` leave out the record of an unfinished last line."""

    pending: Unfinished | None = None
    growths: int = 0

    def trace_path(self, i: int) -> Path:
        return self.root / "traces" / f"part-{self.growths // ROTATE}-{i}.jsonl"

    @property
    def rewards_path(self) -> Path:
        path = self.root / "rewards" / f"rewards-{self.growths // ROTATE}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def expected_good(self) -> set[str]:
        return self.good - (self.pending.good if self.pending else set())

    @property
    def expected_bad(self) -> set[tuple[str, int]]:
        return self.bad - (self.pending.bad if self.pending else set())

    def expected_rows(self) -> list[tuple[str, str, int]]:
        """``(sample_id, source_uri, source_line)`` of every sample expected in traces, sorted."""
        return sorted((sid, *self.origin[sid]) for sid in self.expected_good)

    def grow_some(self, rng: random.Random) -> None:
        """Finish an unfinished line, append 2-6 records and a malformed line, and (3 times in 10) cut the last
        line of one of the files written to short."""
        self.finish_line()
        self.grow(rng.randint(2, 6))
        if rng.random() < 0.3:
            path = self.trace_path(rng.randrange(self.files))
            if path.exists():
                last, rest, line = cut_last_line(path, rng)
                good = {sid for sid, where in self.origin.items() if where == (str(path), line)}
                self.pending = Unfinished(path, rest, good, {(str(path), line)} & self.bad)
                assert good or self.pending.bad, f"line {line} of {path} is in no expectation: {last[:80]}"
        self.growths += 1


@dataclass
class RewardInput(HoldsUnfinished):
    """Reward JSONL files in ``folder`` (``rewards-G.jsonl``, rotating every :data:`ROTATE` growths) that grow by
    lines of every accepted shape, with the events and quarantined lines they must give: ``events`` are
    ``(source_uri, source_line, sample_id, name, value)``, ``bad`` ``(source_uri, source_line)``."""

    folder: Path
    seed: int = 0
    growths: int = 0
    lines: dict[str, int] = field(default_factory=dict)
    """Lines written to each file."""
    samples: int = 0
    accepted: list[tuple[str, list[tuple[str, float]]]] = field(default_factory=list)
    """The lines of the current file that give events, with them ``(name, value)``: repeats are drawn from them
    (identical unstamped events of two files are one event, see :mod:`prl.event_ids`)."""
    events: list[tuple[str, int, str, str, float]] = field(default_factory=list)
    bad: list[tuple[str, int]] = field(default_factory=list)
    pending: Unfinished | None = None

    @property
    def path(self) -> Path:
        """The file being written to."""
        return self.folder / f"rewards-{self.growths // ROTATE}.jsonl"

    def expected_events(self) -> list[tuple[str, int, str, str, float]]:
        held = set(self.pending.events) if self.pending else set()
        return sorted(e for e in self.events if e not in held)

    def expected_bad(self) -> list[tuple[str, int]]:
        held = self.pending.bad if self.pending else set()
        return sorted(b for b in self.bad if b not in held)

    def _line(self, rng: random.Random, plain: bool) -> tuple[str, list[tuple[str, float]] | None]:
        """One line and its events ``(name, value)`` (None: quarantined)."""
        k = self.samples
        self.samples += 1
        sample = f"s{self.seed}-{k}#{k % 3}"
        value = rng.choice([0.0, 1.0, 0.5, -0.25])
        shape = "plain" if plain else rng.choice(["plain", "stamped", "parts", "named", "repeat", "bad", "junk"])
        if shape == "repeat" and self.accepted:
            return rng.choice(self.accepted)
        if shape == "stamped":
            return json.dumps({"sample_id": sample, "reward": value, "created_at": 1_700_000_000 + k}), [
                ("reward", value)
            ]
        if shape == "parts":
            parts = {"format": value, "correct": float(k % 2)}
            return json.dumps({"sample_id": sample, "rewards": parts}), list(parts.items())
        if shape == "named":
            return json.dumps({"sample_id": sample, "name": "length", "value": value}), [("length", value)]
        if shape == "bad":
            return json.dumps({"sample_id": sample, "reward": "high"}), None
        if shape == "junk":
            return '{"sample_id": "broken", ', None
        return json.dumps({"sample_id": sample, "reward": value}), [("reward", value)]

    def grow_some(self, rng: random.Random) -> None:
        """Finish an unfinished line; append 2-6 lines (all of the plain shape half the time, which the columnar
        reader takes); 3 times in 10 cut the last line short."""
        self.finish_line()
        plain = rng.random() < 0.5
        path, uri, texts = self.path, str(self.path), []
        if uri not in self.lines:
            self.accepted = []
        for _ in range(rng.randint(2, 6)):
            text, events = self._line(rng, plain)
            line = self.lines[uri] = self.lines.get(uri, 0) + 1
            texts.append(text)
            if events is None:
                self.bad.append((uri, line))
                continue
            self.accepted.append((text, events))
            sample = json.loads(text)["sample_id"]
            self.events += [(uri, line, sample, name, value) for name, value in events]
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("".join(t + "\n" for t in texts))
        if rng.random() < 0.3:
            _, rest, line = cut_last_line(path, rng)
            events = [e for e in self.events if e[:2] == (uri, line)]
            bad = {(uri, line)} & set(self.bad)
            self.pending = Unfinished(path, rest, events=events, bad=bad)
        self.growths += 1
