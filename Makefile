# The two commands a newcomer needs: `make up` (run the system) and `make test` (pass the
# tests). Both create .venv and install the project into it when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

# The machine's own, older servers (NATS 2.9, PostgreSQL 15) for the second generation run.
LOCAL_NATS_URL ?= nats://127.0.0.1:4222
LOCAL_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: up test test-local-servers test-faults bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

up: $(STAMP)
	$(VENV)/bin/shardbus up

test: $(STAMP)
	$(PY) -m pytest

# The same suite against already-running servers (CI: the machine's NATS and PostgreSQL).
test-local-servers: $(STAMP)
	SHARDBUS_TEST_NATS_URL=$(LOCAL_NATS_URL) SHARDBUS_TEST_DATABASE_URL=$(LOCAL_DATABASE_URL) \
		$(PY) -m pytest

test-faults: $(STAMP)
	$(PY) -m pytest -m faults

bench: $(STAMP)
	@set -e; for script in bench/*.py; do echo "== $$script"; $(PY) $$script; done

docs: $(STAMP)
	$(PY) -m shardbus.settings_catalog --update README.md

clean:
	rm -rf $(VENV) .shardbus .pytest_cache
