# prl — every target sets itself up: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test lint demo bench crash sample-data clean

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
	$(PY) -m mypy

test: setup
	$(PY) -m ruff check prl tests bench scripts
	$(PY) -m ruff format --check prl tests bench scripts
	$(PY) -m mypy
	$(PY) -m pytest -n 2 --durations=15 tests

demo: setup
	bash scripts/demo.sh

bench: setup
	$(PY) bench/run_all.py

# the kill and fault campaign at full strength (tests/test_kill_campaign.py, marked campaign): 100 SIGKILLs per
# writing command on a local store and OUT and on an s3:// store and OUT, and 100 network faults through a proxy,
# each with a rerun and the full accounting; its harnesses run side by side, one per core, and print their figures
crash: setup
	$(PY) -m pytest -p no:cacheprovider -m campaign -s --durations=4 tests/test_kill_campaign.py

sample-data: setup
	$(PY) scripts/make_sample_data.py sample_data

clean:
	rm -rf demo_out bench_out .pytest_cache .ruff_cache
