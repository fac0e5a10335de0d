"""``prl export --format tinker``: shard sets as Tinker ``Datum`` records, one JSON object per line.

Each line holds the datum's JSON form (the Tinker wire shape, which ``tinker.types`` reads back) beside the ids
that say where it came from::

    {"sample_id": "...", "group_id": "...", "set_id": "...",
     "datum": {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [t0, …, t(L-2)]}]},
               "loss_fn_inputs": {
                  "target_tokens": {"data": [t1, …, t(L-1)], "dtype": "int64",   "shape": [L-1]},
                  "logprobs":      {"data": [...],           "dtype": "float32", "shape": [L-1]},
                  "advantages":    {"data": [...],           "dtype": "float32", "shape": [L-1]},
                  "mask":          {"data": [...],           "dtype": "float32", "shape": [L-1]}}}}

``mask`` only with ``with_mask`` (``--mask``). Alignment and values follow :mod:`prl.loaders.tinker` (target ``j``
predicts ``tokens[j + 1]``; advantage 0.0 outside the loss mask; a missing logprob is 0.0 and out of the loss);
rows shorter than two tokens are skipped and counted. ``shard_dir`` is one set folder or an ``OUT`` folder (every
current set, in set-id order).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from prl.errors import UsageError
from prl.loaders.rows import ROW_COLUMNS, Rows
from prl.loaders.tinker import datum_json, tinker_arrays
from prl.shards.layout import SetRef, resolve
from prl.shards.manifest import FileEntry, Manifest
from prl.shards.publish import sha256_file

BATCH_ROWS = 1024


@dataclass
class ExportResult:
    out: str
    rows: int
    skipped: int
    shards: int
    sets: int = 1

    @property
    def exit_code(self) -> int:
        return 0

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "export",
            "format": "tinker",
            "out": self.out,
            "rows": self.rows,
            "skipped": self.skipped,
            "shards": self.shards,
            "sets": self.sets,
            "exit_code": self.exit_code,
        }

    def headline(self) -> str:
        return f"export tinker: {self.rows:,} datums from {self.shards} shards written to {self.out} ({self.skipped} skipped)"


def _lines(ref: SetRef, entry: FileEntry, verify: bool, with_mask: bool) -> tuple[list[bytes], int]:
    """JSON lines of one shard and the number of rows skipped (fewer than two tokens)."""
    path = os.path.join(ref.dir, entry.file)
    if verify and sha256_file(path) != entry.sha256:
        raise UsageError(f"{path} does not match the sha256 in its manifest")
    parquet = pq.ParquetFile(path)
    columns = [c for c in ROW_COLUMNS if c in parquet.schema_arrow.names]
    lines: list[bytes] = []
    skipped = 0
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns):
        rows = Rows.from_arrow(pa.Table.from_batches([batch]))
        arrays = tinker_arrays(rows)
        for i in range(rows.num_rows):  # one JSON object per row; arrays go to orjson as numpy
            if not arrays.has_datum(i):
                skipped += 1
                continue
            record = {
                "sample_id": rows.sample_id_N[i],
                "group_id": rows.group_id_N[i],
                "set_id": ref.set_id,
                "datum": datum_json(arrays, i, with_mask),
            }
            lines.append(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY))
    return lines, skipped


def export_tinker(shard_dir: str, out_jsonl: str, *, verify: bool = True, with_mask: bool = False) -> ExportResult:
    """Write every row of the shard set(s) at ``shard_dir`` as a Tinker datum line to ``out_jsonl``.

    Shards are read in manifest order, one record batch at a time. With ``verify`` each shard's sha256 is checked
    against its manifest first. The output appears atomically (written to a temp file, then renamed)."""
    try:
        refs = resolve(shard_dir)
    except UsageError:
        raise UsageError(f"{shard_dir} is not a shard set (no manifest.json for it)") from None
    manifests = [Manifest.of(ref) for ref in refs]  # an unreadable one: ManifestError, a usage error naming it
    rows = skipped = shards = 0
    tmp = f"{out_jsonl}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as out:
            for ref, manifest in zip(refs, manifests, strict=True):
                for entry in manifest.shards:
                    lines, skipped_here = _lines(ref, entry, verify, with_mask)
                    shards += 1
                    rows += len(lines)
                    skipped += skipped_here
                    if lines:
                        out.write(b"\n".join(lines) + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, out_jsonl)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return ExportResult(out=out_jsonl, rows=rows, skipped=skipped, shards=shards, sets=len(refs))
