# Two commands on a fresh machine:
#   make run    install the agent (its runtime dependencies and `gpuagent top`'s) and run the demo: `gpuagent
#               demo`, a SIMULATED Kubernetes node (8xH100, twelve pods served by a kubelet and an API server of
#               its own), which `gpuagent top` shows
#   make demo   the same, scraped by a Prometheus holding a week of its history (report and recommend at once)
#   make test   install the agent with the test extras and the system packages the tests use, and run lint,
#               layer checks and the test suite (a parallel pass and a serial pass: scripts/run_tests.py)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCENARIO ?= examples/scenarios/demo-k8s-node.yaml
LISTEN ?= 127.0.0.1:9402
# pytest-xdist workers of the parallel pass: more than the CPUs, since many tests wait on servers and scrapes
PYTEST_WORKERS ?= 4
# Two jobs at once: `make test`'s venv (with its extras) and Debian's packages install side by side (on a
# fresh CI machine both download: one after the other they cost the suite's five minutes some 20 s); lint
# still waits for the venv, and every other target is one chain.
MAKEFLAGS += -j2

.PHONY: install install-test system-deps run demo pictures test lint bench gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Installs with uv, itself from PyPI into the venv: a fresh clone's test extras take about 9 s with it against
# 27 s with pip (2 cores, uv's cache empty), the same versions resolved. Where uv cannot be had, pip does it.
define venv_install
	($(BIN)/python -m pip install -q uv && $(BIN)/uv pip install -q --python $(BIN)/python $(1)) || \
	($(BIN)/python -m pip install -q --upgrade pip && $(BIN)/python -m pip install -q $(1))
endef

# The runtime (what `gpuagent run` imports) and the top extra (Textual, Rich): all `make run` needs, and the
# README's next command, `gpuagent top`, works beside it. The test extras (pytest, ruff, import-linter,
# schemathesis, matplotlib, Textual, ...) come with the runtime in one run, so a fresh clone's `make test`
# resolves and builds once, not twice. The Makefile is a prerequisite: a venv installed by an older recipe
# (without top) is brought up to this one.
$(VENV)/.installed: pyproject.toml Makefile | $(BIN)/python
	$(call venv_install,-e '.[top]')
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(call venv_install,-e '.[test]')
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

# The demo node; on a GPU machine the agent itself is `$(BIN)/gpuagent run --backend nvml`.
run: install
	$(BIN)/gpuagent demo --scenario $(SCENARIO) --listen $(LISTEN)

# Prometheus and promtool come from scripts/install-system-deps.sh (Debian's prometheus).
demo: install
	BIN=$(BIN) LISTEN=$(LISTEN) ./scripts/demo.sh

# The README's pictures (docs/top-node.svg, docs/top-cluster.svg): gpuagent top's frames of the demo node,
# recorded afresh from `gpuagent demo` (tests/fixtures/top/demo-k8s-node.json), then drawn.
pictures: install-test
	$(BIN)/python tests/fixtures/top/record.py demo
	$(BIN)/python -m pytest -q tests/test_top_snapshots.py -k readme --snapshot-update

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/lint-imports

system-deps:
	./scripts/install-system-deps.sh

test: install-test lint system-deps
	$(BIN)/python scripts/run_tests.py -n $(PYTEST_WORKERS) -- -q

bench: install-test
	$(BIN)/python bench/bench_poll_scrape.py

# The real-GPU proof (docs/real-gpu.md): every check, one report in $(REPORT)/ (report.md, report.json,
# work.tar.gz). On a lent GPU machine the system python3 (with PyTorch) runs it; without a GPU the same
# command runs the simulator's items with this checkout's .venv.
REPORT ?= gpu-check
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
ONLY ?=
gpu-check:  # ONLY=plant: the plant experiment alone (docs/real-gpu.md)
	$(GPU_PYTHON) bench/real_gpu.py all --out $(REPORT) $(if $(ONLY),--only $(ONLY))

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .demo
