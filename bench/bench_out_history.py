"""S3 requests of one ``build-shards`` run against an ``s3://`` OUT that already holds ``--history`` sets.

Starts a local ``moto_server`` with the counting proxy of the tests (:class:`tests.faulty_proxy.FaultyProxy`, no
faults) in front, and a local store (so every request counted is one against the OUT). Each earlier build ships
one new group of two samples, so the OUT gains one set per build; then one more group is committed and the
measured build publishes one more set. Prints, per history size, that build's requests by kind: GETs of
manifests, of ``index.json``, other GETs, LIST pages, HEAD, PUT, DELETE and POST, and its wall seconds. The last
line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.parse
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def classify(line: str) -> str:
    """The kind of one proxied request line."""
    method, target = line.split(" ")[:2]
    parts = urllib.parse.urlsplit(target)
    path = urllib.parse.unquote(parts.path)
    if method == "GET" and "list-type" in urllib.parse.parse_qs(parts.query):
        return "LIST"
    if method == "GET" and path.endswith("/manifest.json"):
        return "GET manifest"
    if method == "GET" and path.endswith(".prl/index.json"):
        return "GET index"
    return method


def measure(proxy, bucket: str, work: str, history: int, dump: bool) -> dict[str, float | int]:
    """Build ``history`` sets, then count the requests of one more build (``dump``: print them to stderr)."""
    from prl.shards.build import build_shards
    from prl.shards.options import ShardOptions
    from prl.store.tables import Store
    from tests.shards_fixtures import commit_group

    options = ShardOptions(target_tokens=400, seed=1)
    store = Store(os.path.join(work, f"store-{history}"))
    out = f"s3://{bucket}/out"
    for g in range(history):
        commit_group(store, f"g{g}")
        assert build_shards(store, out, options=options).status == "built"
    commit_group(store, f"g{history}")
    start = len(proxy.requests)
    started = time.perf_counter()
    assert build_shards(store, out, options=options).status == "built"
    seconds = time.perf_counter() - started
    lines = proxy.requests[start:]
    if dump:
        print("\n".join(lines), file=sys.stderr)
    counts = Counter(classify(line) for line in lines)
    return {"requests": len(lines), **dict(sorted(counts.items())), "seconds": round(seconds, 2)}


SHOWN = ("requests", "GET manifest", "GET index", "GET", "LIST", "HEAD", "PUT", "DELETE", "POST")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, nargs="+", default=[10, 50], help="sets in OUT before the build")
    parser.add_argument("--dump", action="store_true", help="print each measured build's request lines to stderr")
    args = parser.parse_args()

    from tests.faulty_proxy import FaultyProxy
    from tests.s3_server import CLEARED, CREDENTIALS, client_for, moto_server

    results: dict[str, dict[str, float | int]] = {}
    with moto_server() as endpoint, FaultyProxy(endpoint) as proxy, tempfile.TemporaryDirectory() as work:
        for name in CLEARED:
            os.environ.pop(name, None)
        os.environ.update({**CREDENTIALS, "AWS_ENDPOINT_URL": proxy.url})
        for history in args.history:
            bucket = f"prl-bench-history-{history}"
            client_for(endpoint).create_bucket(Bucket=bucket)
            results[str(history)] = measure(proxy, bucket, work, history, args.dump)
    print(f"{'sets':<8}" + "".join(f"{re.sub('^GET ', '', k)[:9]:>10}" for k in SHOWN) + f"{'seconds':>10}")
    for history, row in results.items():
        print(f"{history:<8}" + "".join(f"{row.get(k, 0):>10}" for k in SHOWN) + f"{row['seconds']:>10.2f}")
    print(json.dumps({"runs": results}))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"bench_out_history took {time.perf_counter() - started:.1f} s", file=sys.stderr)
