# The two commands of the quick start: `make demo` and `make test`.
# Everything is installed into .venv/ and node_modules/ inside the checkout.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHP := node_modules/.bin/configurable-http-proxy
export PATH := $(CURDIR)/$(BIN):$(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

$(CHP): package.json
	npm install --no-audit --no-fund --silent

demo: $(STAMP) $(CHP)
	$(BIN)/python -m gpuslice_hub.demo

test: $(STAMP) $(CHP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/allocation_api.py

clean:
	rm -rf $(VENV) node_modules .demo
