# Entry points for humans and CI. Heavy artefacts are cached in ~/.cache/elastic-supervisor.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup test test-unit test-integration lint cluster-up bench clean help

help:
	@echo "make setup        install everything (idempotent; first run ~10 min, warm ~35 s)"
	@echo "make test         lint + the whole test suite (unit, integration, e2e)"
	@echo "make test-unit    only the fast pure tests"
	@echo "make cluster-up   run the local control plane until Ctrl-C, print its kubeconfig"
	@echo "make bench        benchmarks -> bench/results.json (a few minutes)"

setup:
	bash scripts/setup.sh

$(PY):
	@echo "no virtualenv at $(VENV): run 'make setup' first" >&2; exit 1

lint: $(PY)
	$(VENV)/bin/ruff check .

test: lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test-unit: $(PY)
	$(VENV)/bin/pytest -m unit $(PYTEST_ARGS)

test-integration: $(PY)
	$(VENV)/bin/pytest -m integration $(PYTEST_ARGS)

cluster-up: $(PY)
	$(PY) -m localcluster up

bench: $(PY)
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
