# openwop-seat developer entry points. `make test` is what CI runs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
NODE   := tests/node

.PHONY: setup node lint test test-unit demo bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py proxy/wire/_cframer.c proxy/readpath/_cquiet.c deploy/constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "openwop-seat needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c deploy/constraints.txt -e '.[test]'
	@touch $@

# node-postgres for the driver tests, installed into a test-local folder.
node: $(NODE)/node_modules/.installed

$(NODE)/node_modules/.installed: $(NODE)/package.json $(NODE)/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: sudo apt-get install -y nodejs npm"; exit 1; }
	npm ci --prefix $(NODE) --no-audit --no-fund --loglevel=error
	@touch $@

# Everything: unit tests, then the integration tests against a throwaway PostgreSQL cluster and the real
# clients (psql, pgbench, openssl, node-postgres); a missing client fails the run.
test: setup node lint
	$(PY) -m pytest

# pyflakes, pycodestyle and import order (settings in pyproject.toml).
lint: setup
	$(PY) -m ruff check proxy tests bench

# Pure tests only (tests/unit): no cluster, no client, no node; seconds.
test-unit: setup
	$(PY) -m pytest tests/unit

demo: setup
	$(PY) -m proxy.dev.demo

# The seat against direct PostgreSQL and PgBouncer (docs/performance.md); e.g.
# make bench BENCH_ARGS="--rounds 1 --seconds 2" for a quick look.
bench: setup
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(NODE)/node_modules .pytest_cache
