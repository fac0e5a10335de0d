#!/usr/bin/env bash
# The whole pipeline on sample_data/: ingest → check-tokens → build-shards → inspect.
set -uo pipefail
cd "$(dirname "$0")/.."
PRL=.venv/bin/prl
OUT=demo_out
rm -rf "$OUT"
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() {  # exit 1 (data problems past a threshold) is an expected outcome on the planted bad records
  "$@"; rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then echo "demo step failed (exit $rc): $*" >&2; exit "$rc"; fi
}

step "ingest traces"
run $PRL ingest sample_data/traces sample_data/bad --store "$OUT/store"
step "ingest rewards and reference logprobs"
run $PRL ingest --kind rewards sample_data/rewards.jsonl sample_data/rewards.csv --store "$OUT/store"
run $PRL ingest --kind ref sample_data/ref_logprobs.jsonl --store "$OUT/store"
step "ingest again: nothing new"
run $PRL ingest sample_data/traces sample_data/bad --store "$OUT/store"
