# Two commands on a fresh machine:
#   make run    install the agent (its runtime dependencies only) and run it (a simulated 8xH100 node when no
#               NVIDIA driver is present)
#   make test   install the agent with the test extras and the system packages the tests use, and run lint,
#               layer checks and the test suite (a parallel pass and a serial pass: scripts/run_tests.py)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCENARIO ?= examples/scenarios/h100-8x-64proc.yaml
LISTEN ?= 127.0.0.1:9402
# pytest-xdist workers of the parallel pass: more than the CPUs, since many tests wait on servers and scrapes
PYTEST_WORKERS ?= 4

.PHONY: install install-test run test lint bench gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The runtime (what `gpuagent run` imports): all `make run` needs. The test extras (pytest, ruff, import-linter,
# schemathesis, matplotlib, ...) come with the runtime in one pip run, so a fresh clone's `make test`
# resolves and builds once, not twice.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

run: install
	$(BIN)/gpuagent run --backend auto --scenario $(SCENARIO) --listen $(LISTEN)

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: install-test lint
	./scripts/install-system-deps.sh
	$(BIN)/python scripts/run_tests.py -n $(PYTEST_WORKERS) -- -q

bench: install-test
	$(BIN)/python bench/bench_poll_scrape.py

# The real-GPU proof (docs/real-gpu.md): every check, one report in $(REPORT)/ (report.md, report.json,
# work.tar.gz). On a lent GPU machine the system python3 (with PyTorch) runs it; without a GPU the same
# command runs the simulator's items with this checkout's .venv.
REPORT ?= gpu-check
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	$(GPU_PYTHON) bench/real_gpu.py all --out $(REPORT)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
