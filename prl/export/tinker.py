"""``prl export --format tinker``: a shard set as Tinker ``Datum`` records, one JSON object per line.

Each line is exactly the JSON form of ``tinker.types.Datum`` (a strict model: no other keys), for the
``importance_sampling`` / ``ppo`` losses that Tinker-compatible trainers take::

    {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [t0, …, t(L-2)]}]},
     "loss_fn_inputs": {
        "target_tokens": {"data": [t1, …, t(L-1)], "dtype": "int64",   "shape": [L-1]},
        "logprobs":      {"data": [...],           "dtype": "float32", "shape": [L-1]},
        "advantages":    {"data": [...],           "dtype": "float32", "shape": [L-1]}}}

with ``tokens = input_ids`` (prompt + completion, length L). Position ``j`` predicts ``tokens[j + 1]``, so
completion token ``c`` (at ``tokens[prompt_len + c]``) sits at ``j = prompt_len + c − 1``: there ``logprobs`` is the
behaviour logprob and ``advantages`` the token advantage. Prompt positions hold 0.0 in both. A completion token
whose behaviour logprob is null gets logprob 0.0 and advantage 0.0 (it takes no part in the loss). With
``prompt_len == 0`` the first completion token has no predecessor and is not a target. Rows shorter than two
tokens are skipped and counted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from prl.errors import UsageError
from prl.shards.manifest import MANIFEST, Manifest, ManifestError
from prl.shards.publish import sha256_file


@dataclass
class ExportResult:
    out: str
    rows: int
    skipped: int
    shards: int

    @property
    def exit_code(self) -> int:
        return 0

    def to_json(self) -> dict:
        return {
            "command": "export",
            "format": "tinker",
            "out": self.out,
            "rows": self.rows,
            "skipped": self.skipped,
            "shards": self.shards,
            "exit_code": self.exit_code,
        }


def _flat(column: pa.ChunkedArray | pa.Array, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(values, offsets, valid)`` of a list column; ``valid`` is None when no value is null."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    valid = values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else None
    data = values.to_numpy(zero_copy_only=False)
    if valid is not None:
        data = np.where(valid, data, 0)
    return np.asarray(data, dtype=dtype), offsets - offsets[0], valid


def datum_arrays(batch: pa.RecordBatch | pa.Table):
    """Vectorized Datum arrays of a batch of shard rows.

    Returns ``(tokens_T, tok_off_N1, lp_J, adv_J, j_off_N1)``: the flat ``input_ids`` with their offsets, and flat
    ``logprobs``/``advantages`` (float32) over target positions, ``L_i − 1`` per row (rows with ``L_i < 2``
    get none).
    """
    tokens_T, tok_off, _ = _flat(batch["input_ids"], np.int64)
    lp_C, c_off, lp_valid = _flat(batch["behavior_logprobs"], np.float32)
    adv_C, _, _ = _flat(batch["token_advantages"], np.float32)
    if lp_valid is not None:
        adv_C = np.where(lp_valid, adv_C, np.float32(0.0))
    lengths = np.diff(tok_off)
    targets = np.maximum(lengths - 1, 0)
    j_off = np.concatenate(([0], np.cumsum(targets)))
    prompt = batch["prompt_len"].to_numpy().astype(np.int64)
    clen = np.diff(c_off)
    row_C = np.repeat(np.arange(len(clen)), clen)
    c_idx = np.arange(len(lp_C)) - c_off[:-1][row_C]
    j_C = prompt[row_C] + c_idx - 1
    keep = j_C >= 0
    dest = j_off[:-1][row_C] + j_C
    lp_J = np.zeros(int(j_off[-1]), dtype=np.float32)
    adv_J = np.zeros(int(j_off[-1]), dtype=np.float32)
    lp_J[dest[keep]] = lp_C[keep]
    adv_J[dest[keep]] = adv_C[keep]
    return tokens_T, tok_off, lp_J, adv_J, j_off


def _tensor(data: np.ndarray, dtype: str) -> dict:
    return {"data": data, "dtype": dtype, "shape": [len(data)]}


def export_tinker(shard_dir: str, out_jsonl: str, verify: bool = True) -> ExportResult:
    """Write every row of the shard set in ``shard_dir`` as a Tinker ``Datum`` JSON line to ``out_jsonl``.

    Shards are read in manifest order, one record batch at a time. With ``verify`` each shard's sha256 is checked
    against the manifest first. The output appears atomically (written to a temp file, then renamed).
    """
    if not os.path.isfile(os.path.join(shard_dir, MANIFEST)):
        raise UsageError(f"{shard_dir} is not a shard set (no {MANIFEST})")
    try:
        manifest = Manifest.read(shard_dir)
    except ManifestError as exc:
        raise UsageError(str(exc)) from None
    rows = skipped = 0
    tmp = f"{out_jsonl}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as out:
            for entry in manifest.shards:
                path = os.path.join(shard_dir, entry.file)
                if verify:
                    if sha256_file(path) != entry.sha256:
                        raise UsageError(f"{path} does not match the sha256 in its manifest")
                columns = ["input_ids", "prompt_len", "behavior_logprobs", "token_advantages"]
                for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=columns):
                    tokens_T, tok_off, lp_J, adv_J, j_off = datum_arrays(batch)
                    lines = []
                    for i in range(batch.num_rows):  # one JSON object per row; arrays go to orjson as numpy
                        a, b = int(tok_off[i]), int(tok_off[i + 1])
                        if b - a < 2:
                            skipped += 1
                            continue
                        ja, jb = int(j_off[i]), int(j_off[i + 1])
                        datum = {
                            "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens_T[a : b - 1]}]},
                            "loss_fn_inputs": {
                                "target_tokens": _tensor(tokens_T[a + 1 : b], "int64"),
                                "logprobs": _tensor(lp_J[ja:jb], "float32"),
                                "advantages": _tensor(adv_J[ja:jb], "float32"),
                            },
                        }
                        lines.append(orjson.dumps(datum, option=orjson.OPT_SERIALIZE_NUMPY))
                        rows += 1
                    if lines:
                        out.write(b"\n".join(lines) + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, out_jsonl)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return ExportResult(out=out_jsonl, rows=rows, skipped=skipped, shards=len(manifest.shards))
