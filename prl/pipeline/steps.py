"""The steps of a pipeline, one :class:`RecipeStep` each, in the order ``prl run`` takes them.

A step names its recipe table, its options model (the table's keys, the CLI options and the docs are written from
it: :mod:`prl.options`) and the library call that runs it. :mod:`prl.pipeline.recipe` loads a recipe's tables by
these models, ``prl run`` (:mod:`prl.pipeline.runner`) calls the functions in this order, and ``--only`` takes the
names and the aliases. Adding a stage is one options model, its library call (which builds the stage's
:class:`prl.kernel.Step` and runs it with :func:`prl.kernel.execute`), and one line of :data:`STEPS` (and the typed
field of :class:`prl.pipeline.recipe.Recipe` that holds its table).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from prl.options import CheckTokensOptions, IngestOptions, MaintainOptions, ScoreRefOptions, SideOptions
from prl.shards.options import ShardOptions


@dataclass(frozen=True)
class RecipeStep:
    """One step of ``prl run``.

    ``name``: its recipe table and what ``--only`` calls it (``aliases`` too: its command's name);
    ``options``: the table's model; ``function``: ``"module:name"`` of the library call, imported when the step
    runs (so a recipe loads nothing a step it lacks needs), called with the store, ``dry_run``, the table's fields
    as keywords (the model's field names are the call's) and ``fixed``; ``engine``: the call also takes the
    ``[store]`` engine; ``whole``: the table is read by its model's own ``from_mapping(table, where=...)`` and the
    call takes it as one ``options`` model and the ``[store]`` out as ``out`` instead of the fields
    (``[shards]``)."""

    name: str
    options: type
    function: str
    aliases: tuple[str, ...] = ()
    engine: bool = True
    whole: bool = False
    fixed: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


STEPS: tuple[RecipeStep, ...] = (
    RecipeStep("ingest", IngestOptions, "prl.ingestion.traces:ingest", ("traces",)),
    RecipeStep(
        "rewards",
        SideOptions,
        "prl.ingestion.side_tables:ingest_side_table",
        engine=False,
        fixed=MappingProxyType({"kind": "rewards"}),
    ),
    RecipeStep(
        "ref",
        SideOptions,
        "prl.ingestion.side_tables:ingest_side_table",
        engine=False,
        fixed=MappingProxyType({"kind": "ref"}),
    ),
    RecipeStep("check", CheckTokensOptions, "prl.checks:check_tokens", ("check-tokens",)),
    RecipeStep("score_ref", ScoreRefOptions, "prl.score.run:score_ref", ("score-ref",)),
    RecipeStep("shards", ShardOptions, "prl.shards.build:build_shards", ("build-shards",), whole=True),
    RecipeStep("maintain", MaintainOptions, "prl.maintain:maintain", engine=False),
)
"""Every step, in run order."""

BY_NAME: Mapping[str, RecipeStep] = MappingProxyType(
    {name: step for step in STEPS for name in (step.name, *step.aliases)}
)
"""Each step by its name and by each of its aliases."""
assert len(BY_NAME) == sum(1 + len(step.aliases) for step in STEPS), "a step name or alias is used twice"

__all__ = ["BY_NAME", "STEPS", "RecipeStep"]
