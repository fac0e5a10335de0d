"""Load shard sets into trainers: numpy batches (padded or packed) and adapters for verl, TRL, prime-rl, Tinker.

Quick start::

    from prl.loaders import ShardLoader, to_verl
    loader = ShardLoader("OUT", batch_rows=256, rank=rank, world_size=world, seed=0)
    loader.load_state_dict(saved)            # resume where a checkpoint left off
    for batch in loader:                     # one epoch; batch.rows for the adapters
        data = to_verl(batch.rows, as_torch=True)

Everything here reads what ``prl build-shards`` wrote and needs only numpy and pyarrow; ``as_torch`` needs torch,
:func:`to_tinker` the Tinker SDK (``pip install 'prl[tinker]'``).
"""

from prl.loaders.loader import ShardLoader
from prl.loaders.prime_rl import to_prime_rl
from prl.loaders.rows import PackedBatch, PaddedBatch, Rows, pack, pad
from prl.loaders.tinker import tinker_arrays, to_tinker
from prl.loaders.trl import importance_sampling_ratio, to_trl_grpo
from prl.loaders.verl import TemperatureWarning, VerlBatch, to_verl

__all__ = [
    "PackedBatch",
    "PaddedBatch",
    "Rows",
    "ShardLoader",
    "TemperatureWarning",
    "VerlBatch",
    "importance_sampling_ratio",
    "pack",
    "pad",
    "tinker_arrays",
    "to_prime_rl",
    "to_tinker",
    "to_trl_grpo",
    "to_verl",
]
