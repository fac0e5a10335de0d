"""Print the layout of a shard set's merged multi-turn rows (``make demo`` runs it on ``demo_out/merged``).

For each of the rows holding the most turns: its first sample id, the first prompt's length, then runs of the
completion-aligned positions: ``sampled:N`` (inside the loss mask) and ``between:N`` (user, tool and observation
tokens between completions, or masked tokens), with the row's reward and policy version.

Usage: python scripts/show_merged_rows.py OUT [ROWS]
"""

from __future__ import annotations

import itertools
import os
import sys

import pyarrow.parquet as pq

from prl.shards.layout import resolve
from prl.shards.manifest import Manifest


def runs(mask: list[bool]) -> str:
    """``sampled:3 between:2 …`` of a loss mask."""
    return " ".join(f"{'sampled' if on else 'between'}:{len(list(g))}" for on, g in itertools.groupby(mask))


def main(out: str, count: int = 3) -> None:
    rows = []
    for ref in resolve(out):
        for entry in Manifest.of(ref).shards:
            rows += pq.read_table(os.path.join(ref.dir, entry.file)).to_pylist()
    rows.sort(key=lambda r: (-sum(1 for _ in itertools.groupby(r["loss_mask"])), r["sample_id"]))
    for r in rows[:count]:
        print(
            f"  {r['sample_id'][:32]}  prompt:{r['prompt_len']} {runs(r['loss_mask'])}"
            f"  reward {r['reward']:.2f}  version {r['policy_version']}"
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
