# Two promises: `make run` and `make test` work on a fresh machine.
# `make setup` builds .venv once (idempotent: a stamp file records the recipe).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU recipe (the default). GPU users: TORCH_SPEC='torch==2.13.0' FBGEMM_SPEC='fbgemm-gpu==1.8.0'
# with a CUDA wheel index, see README.
TORCH_SPEC ?= torch==2.13.0
FBGEMM_SPEC ?= fbgemm-gpu-cpu==1.8.0
TORCHREC_SPEC ?= torchrec==1.8.0
# Versions the tests run with (pip -c); GPU users: CONSTRAINTS= (none) or their own file.
CONSTRAINTS ?= constraints/cpu.txt
PIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
# The stamp names the recipe: `make setup FBGEMM_SPEC=...` with other specs installs again.
SPECS_ID := $(shell printf '%s' '$(TORCH_SPEC) $(FBGEMM_SPEC) $(TORCHREC_SPEC) $(CONSTRAINTS)' | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.recd-setup-$(SPECS_ID)

.PHONY: setup run test test-fast lint typecheck bench bench-quick clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check $(PIN) '$(TORCH_SPEC)'
	$(PIP) install --quiet --disable-pip-version-check $(PIN) '$(FBGEMM_SPEC)' tensordict torchmetrics tqdm pyre-extensions
	$(PIP) install --quiet --disable-pip-version-check --no-deps '$(TORCHREC_SPEC)'
	$(PIP) install --quiet --disable-pip-version-check $(PIN) -e '.[spark,ray,bench,dev]'
	$(PY) -c "import torch, torchrec, fbgemm_gpu, pyarrow, zstandard; print('recd setup ok: torch', torch.__version__, 'torchrec', torchrec.__version__ if hasattr(torchrec, '__version__') else '1.8')"
	touch $(STAMP)

# small: the pipeline shipped as recd/pipelines/small.toml (`recd init --list`).
run: setup
	$(VENV)/bin/recd run --config small

# --durations: the slowest tests at the end of every run, to keep the suite under ~15 min
test: setup
	$(PY) -m pytest -q tests --durations=25

# the fast subset while you work: the unit tests (about a minute on 2 cores, no child processes
# of recd train, no Spark); make test before you push (it prints the 25 slowest tests). Every
# test carries its folder's marker: pytest -m unit, -m integration, -m distributed, -m "not slow"
test-fast: setup
	$(PY) -m pytest -q tests/unit -m "not slow"

lint: setup
	$(VENV)/bin/ruff check recd benchmarks tests
	$(VENV)/bin/ruff format --check recd benchmarks tests

typecheck: setup
	$(VENV)/bin/mypy

bench-quick: setup
	$(PY) benchmarks/storage.py --quick

bench: setup
	$(PY) benchmarks/storage.py

clean:
	rm -rf runs/ .pytest_cache .mypy_cache .ruff_cache
