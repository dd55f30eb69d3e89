# The two commands of the quick start: `make demo` and `make test`.
# Everything is installed into .venv/ and node_modules/ inside the checkout.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHP := node_modules/.bin/configurable-http-proxy
export PATH := $(CURDIR)/$(BIN):$(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: demo test test-fast lint typecheck bench clean labextension

# rfc3987-syntax goes: jsonschema's optional checker of the "iri" formats (jupyter_events'
# jsonschema[format-nongpl] pulls it in) builds some 35 parsers when it is imported, 1.6 s of
# CPU in every Jupyter process (the hub, the service, each server, each batch job), and no
# schema here uses those formats (upstream: python-jsonschema/jsonschema#1428). A site's
# servers start faster without it too (admin guide, "Start-up time of servers").
# (said first: pip is quiet, and the first run installs for minutes before anything shows)
$(STAMP): pyproject.toml
	@echo "Installing gpuslice and its dependencies into $(VENV)/ and node_modules/, then"
	@echo "building the JupyterLab extension: a few minutes the first time (about 3.5 min"
	@echo "to a running hub on a fresh machine); later runs start in seconds."
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip uninstall --quiet --yes rfc3987-syntax
	touch $(STAMP)

$(CHP): package.json
	npm install --no-audit --no-fund --silent

# The JupyterLab extension: built into server_ext/gpuslice/labextension (what the wheel
# ships), then copied into the venv so the single-user servers started by the tests and the
# demo load it. A copy, not a symlink: pip reinstalls would delete files through a symlink.
LABEXT_NPM := labextension/node_modules/.package-lock.json
LABEXT_OUT := server_ext/gpuslice/labextension/package.json
LABEXT_VENV := $(VENV)/share/jupyter/labextensions/gpuslice-labextension
LABEXT_SRC := labextension/package.json labextension/tsconfig.json $(wildcard labextension/src/*.ts labextension/style/* labextension/schema/*.json)

$(LABEXT_NPM): labextension/package.json labextension/package-lock.json
	cd labextension && npm ci --no-audit --no-fund

$(LABEXT_OUT): $(LABEXT_NPM) $(LABEXT_SRC) | $(STAMP)
	cd labextension && npm run build

$(LABEXT_VENV)/package.json: $(LABEXT_OUT) labextension/install.json
	rm -rf $(LABEXT_VENV)
	mkdir -p $(dir $(LABEXT_VENV))
	cp -R server_ext/gpuslice/labextension $(LABEXT_VENV)
	cp labextension/install.json $(LABEXT_VENV)/install.json

labextension: $(LABEXT_VENV)/package.json

demo: $(STAMP) $(CHP) labextension
	$(BIN)/python -m gpuslice_hub.demo

# Lint first: a red ruff or mypy costs seconds, the suite twenty minutes.
# Four workers by default, on two CPUs: most of the suite waits on real processes (hubs,
# Slurm, kernels, Chromium, time windows). On the 2-vCPU machine of tests/README.md the
# suite took 1 380 s with two workers and 1 143 s with three; without rfc3987-syntax (above)
# 930 s with three and 823 s with four, using 1.4 CPUs on average. Each worker starts its
# own PostgreSQL and Slurm; a file's tests stay on one worker (module-scoped hubs).
# PYTEST_WORKERS=0 runs everything in one process (pdb).
PYTEST_WORKERS ?= 4
test: $(STAMP) $(CHP) labextension lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The tests that start no real part (no JupyterHub, Slurm, PostgreSQL, Chromium, npm build):
# a contributor's first check, without the lint and the labextension build. A test that
# starts one without its marker fails (tests/harness/markers.py), so none slips in here.
FAST := not hub and not slurm and not postgres and not browser and not npm
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "$(FAST)" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/allocation_api.py

clean:
	rm -rf $(VENV) node_modules .demo
