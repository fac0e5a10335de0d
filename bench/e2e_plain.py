"""The script a user would write instead of prl: polars and the tokenizer, none of prl's checks or guarantees.

    python bench/e2e_plain.py TRACES.jsonl REWARDS.jsonl REFS.jsonl TOKENIZER_DIR OUT.parquet

Reads vLLM chat completions (one choice per record, ``token_ids``, ``prompt_token_ids``, chat logprobs) with
``polars.read_ndjson``; round-trips prompt + completion of every sample through the tokenizer
(``decode_batch`` + ``encode_batch``); reads rewards (``request_id``, ``choice_index``, ``name``, ``value``)
and reference logprobs (``request_id``, ``choice_index``, ``ref_logprobs``, ``ref_model``); joins; group-mean
advantages by prompt; k3 KL clipped; ``write_parquet`` zstd. Prints its stage times as one JSON object: what
``bench/e2e.py`` compares prl against.
"""

import json
import sys
import time

started = time.perf_counter()

import polars as pl  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

traces_path, rewards_path, refs_path, tokenizer_dir, out_path = sys.argv[1:6]
stages = {"imports": time.perf_counter() - started}

# 1. traces: one row per sample
t0 = time.perf_counter()
raw = pl.read_ndjson(traces_path)
choice = pl.col("choices").list.first()
samples = raw.select(
    pl.col("id").alias("request_id"),
    choice.struct.field("index").alias("choice_index"),
    pl.col("prompt_token_ids"),
    choice.struct.field("token_ids").alias("completion_token_ids"),
    choice.struct.field("logprobs")
    .struct.field("content")
    .list.eval(pl.element().struct.field("logprob"))
    .alias("logprobs"),
    choice.struct.field("finish_reason"),
)
stages["ingest traces"] = time.perf_counter() - t0

# 2. tokenizer round trip of prompt + completion
t0 = time.perf_counter()
tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
ids = samples.select(pl.concat_list("prompt_token_ids", "completion_token_ids")).to_series().to_list()
texts = tok.decode_batch(ids, skip_special_tokens=False)
encoded = tok.encode_batch(texts, add_special_tokens=False)
ok = [e.ids == s for e, s in zip(encoded, ids)]
samples = samples.with_columns(roundtrip_ok=pl.Series(ok))
stages["check-tokens"] = time.perf_counter() - t0

# 3. rewards, reference logprobs, join, advantages, KL, shards
t0 = time.perf_counter()
rewards = pl.read_ndjson(rewards_path).filter(pl.col("name") == "reward").select("request_id", "choice_index", "value")
refs = pl.read_ndjson(refs_path).select("request_id", "choice_index", "ref_logprobs")
x = (pl.col("ref_logprobs") - pl.col("logprobs")).list.eval(pl.element().clip(-20.0, 20.0))  # -log(q/p_ref)
table = (
    samples.join(rewards, on=["request_id", "choice_index"])
    .join(refs, on=["request_id", "choice_index"])
    .with_columns(
        reward=pl.col("value"),
        advantage=pl.col("value") - pl.col("value").mean().over("request_id"),
        kl=(x.list.eval(pl.element().exp()) - x - 1.0).list.eval(pl.element().clip(upper_bound=10.0)),
    )
    .drop("value")
    .sample(fraction=1.0, shuffle=True, seed=0)
)
table.write_parquet(out_path, compression="zstd")
stages["rewards + refs + build-shards"] = time.perf_counter() - t0
stages["rows"] = table.height
stages["roundtrip_ok"] = sum(ok)
stages["tokens"] = int(sum(len(s) for s in ids))
print(json.dumps(stages))
