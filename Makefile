# Every target sets up what it needs: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is installed first and on its own: 2.13.0 is the CPU wheel for development. GPU users bring
# their own CUDA build; a range that an installed torch satisfies installs nothing more.
TORCH_SPEC ?= torch==2.13.0
# The tests' MLflow tracking server, in a venv of its own: the full `mlflow` package pins python-dateutil
# below what the kubernetes client needs. orch's venv has only the client (the `tracking` extra).
MLFLOW_VENV ?= .venv-mlflow
MLFLOW_SERVER_SPEC ?= mlflow>=2.10,<4
# The tests' S3-compatible server (moto's server mode), in a venv of its own for the same reason: boto3
# pins python-dateutil below the kubernetes client's floor (tests/s3server.py starts it).
MOTO_VENV ?= .venv-moto
MOTO_SERVER_SPEC ?= moto[server]>=5

.PHONY: install mlflow-server moto-server demo test test-all lint bench gpu-check gpu-check-tiny clean

install: $(VENV)/.installed

# PYTHONWARNINGS: silences setuptools' informational notice on editable installs of a mapped folder (manifests/)
# The distribution orch-trainer (package orchestrator, command orch), editable, with its extras.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet -e '.[train,dev,tracking]'
	touch $@

mlflow-server: $(MLFLOW_VENV)/.installed

$(MLFLOW_VENV)/.installed:
	test -x $(MLFLOW_VENV)/bin/python || $(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install --quiet '$(MLFLOW_SERVER_SPEC)'
	touch $@

moto-server: $(MOTO_VENV)/.installed

$(MOTO_VENV)/.installed:
	test -x $(MOTO_VENV)/bin/python || $(PYTHON) -m venv $(MOTO_VENV)
	$(MOTO_VENV)/bin/pip install --quiet '$(MOTO_SERVER_SPEC)'
	touch $@

demo: install
	$(BIN)/orch run examples/digits.yaml

# The tiers (docs/testing.md): tests/tiers.py marks every test that starts a process or server `slow` at collection.
# `make test` is the fast tier (in-process tests plus one `smoke` test per path); `make test-all` runs everything
# (what .ci/run calls). Both use every core: --dist loadgroup keeps the tests that share an expensive fixture (the
# MLflow server, a module's training run) on one worker. The full tier runs two workers per core: its tests wait
# (servers starting, scrape intervals, downloads, disk copies of images) and another worker's test uses the core
# meanwhile. It prints the 25 slowest set-ups and tests, so a CI log shows where the time went.
# PYTEST_ARGS adds to it, e.g. PYTEST_ARGS='tests/spec -x'.
PYTEST_WORKERS ?= auto
PYTEST_ALL_WORKERS ?= $(shell echo $$((2 * $$(nproc 2>/dev/null || echo 1))))
PYTEST := $(BIN)/python -m pytest -q --dist loadgroup

test: install
	$(PYTEST) -n $(PYTEST_WORKERS) -m "not slow or smoke" $(PYTEST_ARGS)

test-all: install mlflow-server moto-server
	$(PYTEST) -n $(PYTEST_ALL_WORKERS) --durations=25 $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check orchestrator tests benchmarks
	$(BIN)/ruff format --check orchestrator tests benchmarks
	$(BIN)/mypy  # [tool.mypy] in pyproject.toml says what and how strictly

bench: install
	$(BIN)/pip install --quiet -e '.[bench]'  # Accelerate, the third loop of the comparison
	# TorchX (the CLI comparison) beside the venv, not in it: it pins urllib3 < 1.27, the kubernetes client needs >= 2.8
	test -d build/torchx-site/torchx || $(BIN)/pip install --quiet --target build/torchx-site 'torchx==0.7.0'
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# One GPU, < 8 min: a table and runs/gpu-check.json (docs/performance.md). GPU_CHECK_ARGS adds flags, e.g.
# GPU_CHECK_ARGS='--json /tmp/report.json'; `make gpu-check-tiny` is the same logic on a CPU (--tiny).
gpu-check: install
	$(BIN)/python -m benchmarks.gpu --check $(GPU_CHECK_ARGS)

gpu-check-tiny: install
	$(BIN)/python -m benchmarks.gpu --check --tiny $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(MLFLOW_VENV) build dist *.egg-info .pytest_cache .mypy_cache runs
