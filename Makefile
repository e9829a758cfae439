# Boss: the two commands a newcomer needs are `make run` and `make test`; both set themselves up.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_BOOTSTRAP ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
IMPORT_PATH := $(VENV)/.import-path
GENERATED := gen/.generated
PROTOS := $(shell find protos/boss -name '*.proto')
# The real Codex CLI the tests and `make run` drive (npm @openai/codex), installed into CODEX_DIR.
CODEX_VERSION := 0.169.0
CODEX_DIR := .tools/codex
export PYTHONPATH := $(CURDIR):$(CURDIR)/gen

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(INSTALLED): requirements.txt requirements-dev.txt
	@echo "==> creating the virtualenv in $(VENV) and installing pinned dependencies"
	$(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $@

$(GENERATED): $(INSTALLED) $(PROTOS) scripts/generate_protos.sh
	@echo "==> generating gRPC code from protos/"
	PYTHON=$(PY) ./scripts/generate_protos.sh
	@touch $@

# The project and gen/ on the virtualenv's import path (a .pth file), so `.venv/bin/python -m worker`
# or `-m services.<name>` works from any folder without setting PYTHONPATH.
$(IMPORT_PATH): $(INSTALLED)
	@echo "==> putting the project and gen/ on the virtualenv's import path"
	$(PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "boss-project.pth").write_text("\n".join(sys.argv[1:]) + "\n")' "$(CURDIR)" "$(CURDIR)/gen"
	@touch $@

setup: $(GENERATED) $(IMPORT_PATH) ## create the virtualenv, install dependencies, generate code

generate: ## regenerate Python code from protos/ (never edit gen/ by hand)
	PYTHON=$(PY) ./scripts/generate_protos.sh
	@touch $(GENERATED)

codex: ## install the real Codex CLI (npm @openai/codex at the pinned CODEX_VERSION) into .tools/codex; needs npm
	@./scripts/install_codex.sh $(CODEX_VERSION) $(CODEX_DIR)

run: setup codex ## start every service and a worker (SQLite; demo data if needed); ARGS="--codex-home DIR" etc.
	$(PY) -m services.local_stack $(ARGS)

browser: ## install Debian's chromium for the browser test (as root; otherwise that test is skipped)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "==> installing Debian's chromium for the browser test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is not installed and cannot be installed here: the browser test will be skipped"; fi; }

# How many processes `make test` runs the suite in (each test file runs in one of them, so a file's
# shared fixtures are set up once); items that share a node id run after, in one process.
TEST_WORKERS ?= 2

test: setup browser codex ## run the whole suite (unit, SQLite + PostgreSQL integration, end to end, browser)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not one_process"
	$(PY) -m pytest -m one_process

test-unit: setup ## only the pure unit tests
	$(PY) -m pytest tests/unit

lint: setup ## ruff, mypy and buf lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy services worker boss_common demo_model
	cd protos && ../$(VENV)/bin/buf lint

worker-wheel: setup ## build the device worker's own package (packaging/worker/) into dist/
	PYTHON=$(PY) ./scripts/build_worker_wheel.sh dist

bench: setup ## run the benchmarks against PostgreSQL (see bench/RESULTS.md)
	$(PY) -m bench.run_all

clean: ## remove generated code and local data (keeps the virtualenv)
	rm -rf gen var protos/third_party dist

.PHONY: help setup browser codex generate run test test-unit lint worker-wheel bench clean
