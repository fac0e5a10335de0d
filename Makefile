# prl — every target sets itself up: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-all lint demo bench crash sample-data clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet 'torch==2.13.0'  # pinned first: this machine's CPU wheel; `prl[ref]` then needs no download
	$(PY) -m pip install --quiet -e '.[test,ref,ray]'
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(PY) -m ruff check prl tests bench scripts
	$(PY) -m ruff format --check prl tests bench scripts
	$(PY) scripts/import_graph.py --check >/dev/null || $(PY) scripts/import_graph.py --check
	$(PY) -m mypy

# the README's test command: lint, types, unit and integration tests (a small sample of each campaign); under 6 minutes
test: lint
	$(PY) -m pytest -n 2 --durations=15 -m "not campaign and not genuine" tests

# the long campaigns on top: hundreds of kills and faults on local and S3 stores, the fuzz million, the Ray cluster,
# the genuine engines and trainers (each in its own virtualenv, set up here)
test-all: setup
	$(PY) -m pytest -n 2 --durations=25 -rs -m "campaign or genuine" tests

demo: setup
	bash scripts/demo.sh

bench: setup
	$(PY) bench/run_all.py

# the crash tests at full strength: 100 SIGKILLs per writing command on a local store and on an s3:// store and OUT
# (the S3 hundreds took 38 min for the four commands one after another on 2 busy cores; `make test` runs the
# local hundred and 16 per command on S3)
crash: setup
	PRL_CRASH_KILLS=100 PRL_CRASH_S3_KILLS=100 $(PY) -m pytest -n 2 --durations=8 tests/test_crash_kills.py

sample-data: setup
	$(PY) scripts/make_sample_data.py sample_data

clean:
	rm -rf demo_out bench_out .pytest_cache .ruff_cache
