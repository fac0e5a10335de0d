"""Which rewards score a build (docs/design.md): the recipe's choice, or the one reward the table holds.

``[shards] rewards`` (``--set rewards=…``) names the components and weights. When it names none, the score is
the single reward name the rewards table holds at the pinned version; several names and no choice is a usage error
listing them (a guess would silently train on the wrong signal); an empty or absent table scores with the name
``reward``, so every sample is dropped as ``missing_reward`` and the build says so (exit 1).
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow.compute as pc

from prl.errors import UsageError
from prl.shards.options import ShardOptions
from prl.store.tables import Store

DEFAULT_NAME = "reward"


def reward_names(store: Store, version: int | None) -> list[str]:
    """The distinct reward names of ``rewards`` at ``version``, sorted (none without the table)."""
    if version is None:
        return []
    names = store.read("rewards", columns=["name"], version=version)["name"]
    return sorted(str(n) for n in pc.unique(names).to_pylist())


def resolve_rewards(store: Store, version: int | None, options: ShardOptions) -> ShardOptions:
    """``options`` with its reward components chosen (see the module docstring)."""
    if options.rewards:
        return options
    names = reward_names(store, version)
    if len(names) > 1:
        listed = ", ".join(names)
        raise UsageError(
            f"the rewards table holds {len(names)} reward names ({listed}) and the recipe chooses none: name the "
            f"score with [shards] rewards = {{ {names[0]} = 1.0 }} in the recipe or --set rewards={names[0]} "
            "(weighted sums: --set rewards=NAME=W,NAME=W)"
        )
    return replace(options, rewards={names[0] if names else DEFAULT_NAME: 1.0})


__all__ = ["DEFAULT_NAME", "resolve_rewards", "reward_names"]
