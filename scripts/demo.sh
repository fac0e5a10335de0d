#!/usr/bin/env bash
# The whole pipeline on sample_data/ with one recipe (recipes/demo.toml): ingest → rewards → check-tokens →
# score-ref (reference logprobs from a tiny model built here) → build-shards with KL, then a look at the store and the shard sets,
# a set of merged multi-turn rows, and a second run that finds nothing new. The same command is what cron runs (see recipes/crontab.example).
set -uo pipefail
cd "$(dirname "$0")/.."
PRL=.venv/bin/prl
rm -rf demo_out

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() {  # exit 1 (data problems past a threshold) is an expected outcome on the planted bad records
  "$@"; rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then echo "demo step failed (exit $rc): $*" >&2; exit "$rc"; fi
}

step "a tiny reference model for score-ref (scripts/make_demo_ref_model.py)"
run .venv/bin/python scripts/make_demo_ref_model.py demo_out/ref_model
step "prl run recipes/demo.toml"
run $PRL run recipes/demo.toml
step "prl inspect demo_out/store"
run $PRL inspect demo_out/store
step "prl inspect demo_out/shards"
run $PRL inspect demo_out/shards
step "prl verify demo_out/shards"
run $PRL verify demo_out/shards
step "prl build-shards --set merge_turns=true: each trajectory's CLEAN turns as one row"
run $PRL build-shards --store demo_out/store --out demo_out/merged --recipe recipes/demo.toml --set merge_turns=true
run .venv/bin/python scripts/show_merged_rows.py demo_out/merged
step "prl run recipes/demo.toml again: nothing new"
run $PRL run recipes/demo.toml
