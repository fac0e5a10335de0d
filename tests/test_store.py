"""Store: table versions, pinned reads and the writer settings of its data files."""

from __future__ import annotations

import glob
import os

import pyarrow.parquet as pq

from prl.schema import REWARDS, TRACES, float_leaves, leaf_paths
from prl.store.tables import Store, parquet_options
from tests.shards_fixtures import reward, table, trace


def test_a_scan_of_a_pinned_version_reads_that_version(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.commit("rewards", table(REWARDS, [reward("a:0", 1.0)]).to_batches())
    pinned = store.versions()
    assert (
        pinned["rewards"] == 1
        and pinned["traces"] is None
        and set(pinned)
        == {
            "traces",
            "quarantine",
            "rewards",
            "ref_logprobs",
            "checks",
        }
    )
    store.commit("rewards", table(REWARDS, [reward("b:0", 2.0)]).to_batches())
    # the table opened for versions() is reused only for the version it was opened at
    assert store.read("rewards", version=1)["sample_id"].to_pylist() == ["a:0"]
    assert sorted(store.read("rewards", version=2)["sample_id"].to_pylist()) == ["a:0", "b:0"]
    assert sorted(store.read("rewards")["sample_id"].to_pylist()) == ["a:0", "b:0"]
    assert store.versions()["rewards"] == 2
    assert store.read("rewards", version=1)["sample_id"].to_pylist() == ["a:0"]


def test_leaf_paths_and_float_leaves():
    paths = dict(leaf_paths(TRACES))
    assert "prompt_token_ids.list.element" in paths and "topk_ids.list.element.list.element" in paths
    assert "policy_version_spans.list.element.start" in paths
    assert float_leaves(TRACES) == [
        "completion_logprobs.list.element",
        "topk_logprobs.list.element.list.element",
        "temperature",
        "top_p",
    ]


def test_data_files_split_float_bytes_and_keep_dictionaries_elsewhere(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.commit(
        "traces", table(TRACES, [trace("a:0", "g", [1, 2], [3, 4], completion_logprobs=[-0.5, -1.5])]).to_batches()
    )
    (path,) = glob.glob(os.path.join(store.uri, "traces", "*.parquet"))
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "BYTE_STREAM_SPLIT" in encodings["completion_logprobs.list.element"]
    assert "RLE_DICTIONARY" not in encodings["completion_logprobs.list.element"]
    assert "RLE_DICTIONARY" in encodings["prompt_token_ids.list.element"]
    assert meta.column(0).compression == "ZSTD"
    options = parquet_options(TRACES)
    assert set(options["use_byte_stream_split"]).isdisjoint(options["use_dictionary"])
    assert pq.read_table(path)["completion_logprobs"].to_pylist() == [[-0.5, -1.5]]
