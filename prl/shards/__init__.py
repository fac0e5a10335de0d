"""Shard sets: checked traces + rewards (+ reference logprobs) → Parquet shards and a manifest (docs/design.md).

One module per job, in the order a build takes them (:func:`prl.shards.build.build_shards` runs them):

- :mod:`~prl.shards.options` — :class:`ShardOptions`, the ``[shards]`` table of a recipe, validated; policy
  version parsing.
- :mod:`~prl.shards.frontier` — what the last build left unshipped and which traces files the next one reads;
  :mod:`~prl.shards.turns` — a large build's files in turns of at most ``max_set_samples`` rows, a set per turn;
  :mod:`~prl.shards.advance` — the frontier a build (or turn) leaves.
- :mod:`~prl.shards.scan` — the plan scans: per-sample scalars of ``traces`` / ``ref_logprobs`` at pinned table
  versions, spilling token columns as they go; latest reward and verdict per sample.
- :mod:`~prl.shards.spill` — :class:`ScanSpill`: an Arrow IPC file of spilled rows, gathered back by row number.
- :mod:`~prl.shards.plan` — joins, drop reasons (:data:`DROP_REASONS`), already-shipped samples, constant groups,
  group shuffle and packing into shards: a :class:`Plan` (shipped samples in final order, with shard numbers).
- :mod:`~prl.shards.scores` — KL sums / batch mean log ratio and group-relative advantages over the shipped rows
  (the formulas are :mod:`prl.numerics`).
- :mod:`~prl.shards.gather` — shared helpers of the per-shard passes (worker count, blocks, loss masks, lists).
- :mod:`~prl.shards.rowgroups` — a shard's row groups: runs of whole groups of about ``ROW_GROUP_TOKENS`` tokens.
- :mod:`~prl.shards.assemble` — one row group's ``SHARD`` table from its gathered rows, plan rows and scores.
- :mod:`~prl.shards.parts` — one part (shard file): its rows gathered, assembled and written a row group at a time.
- :mod:`~prl.shards.writer` — Parquet via pyarrow (zstd, byte-stream-split floats), hashed as written.
- :mod:`~prl.shards.statistics` — the summaries a build reports and its manifest records.
- :mod:`~prl.shards.manifest` — the typed :class:`Manifest` (``manifest.json``) and the sets of an ``OUT`` folder.
- :mod:`~prl.shards.publish` — staging, fsync + rename, the set folder's atomic rename, ``.OUT.prl/index.json``.
- :mod:`~prl.shards.s3out` — an ``s3://`` OUT: uploads, the manifest's conditional put, its sets read back.
- :mod:`~prl.shards.target` — where a build publishes: a local OUT folder or an ``s3://`` OUT, one interface.
- :mod:`~prl.shards.result` — :class:`ShardResult`, what a build returns.
- :mod:`~prl.shards.build` — the orchestration: pin versions, plan, score, write, publish, under the step lock.
- :mod:`~prl.shards.verify` — ``prl verify``: recompute every file's size, sha256, rows and tokens.

Where new capabilities go: a new kind of row (merged multi-turn trajectories) is a new plan step that produces
the same :class:`Plan` shape plus an assembly function beside :func:`assemble_shard`; readers of shard sets
(loaders) build on :class:`Manifest` and :data:`prl.schema.SHARD`; the set layout (file names, index) lives in
:mod:`~prl.shards.manifest` and :mod:`~prl.shards.publish` only.
"""
