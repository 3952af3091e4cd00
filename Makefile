# The two commands a newcomer needs: `make up` (run the system) and `make test` (pass the
# tests). Both create .venv and install the project into it when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

# The machine's own, older servers (NATS 2.9, PostgreSQL 15) for the second generation run.
LOCAL_NATS_URL ?= nats://127.0.0.1:4222
LOCAL_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: up test test-local-servers test-faults bench soak docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

up: $(STAMP)
	$(VENV)/bin/shardbus up

# The fault suite (tests/faults, marked `faults`) runs on its own: make test-faults.
test: $(STAMP)
	$(PY) -m pytest -m "not faults"

# The same suite against already-running servers (CI: the machine's NATS and PostgreSQL).
test-local-servers: $(STAMP)
	SHARDBUS_TEST_NATS_URL=$(LOCAL_NATS_URL) SHARDBUS_TEST_DATABASE_URL=$(LOCAL_DATABASE_URL) \
		$(PY) -m pytest -m "not faults"

test-faults: $(STAMP)
	$(PY) -m pytest -m faults

bench: $(STAMP)
	@set -e; for script in bench/*.py; do echo "== $$script"; $(PY) $$script; done

# The soak: the whole embedded stack under steady load for MINUTES (figures in
# docs/performance.md, "Soak"); `make bench` runs it for its default 1 minute.
MINUTES ?= 10
soak: $(STAMP)
	$(PY) bench/soak.py --minutes $(MINUTES)

# The README's settings table and each service's AsyncAPI document (every subject it
# serves, with its payload schema), both generated from the code.
docs: $(STAMP)
	$(PY) -m shardbus.settings_catalog --update README.md
	@mkdir -p docs/asyncapi
	@set -e; for service in gateway ledger cleanup installer; do \
		$(VENV)/bin/faststream docs gen --factory "services.$$service.app:create_app" \
			--out docs/asyncapi/$$service.json >/dev/null; \
		echo "docs/asyncapi/$$service.json"; done

clean:
	rm -rf $(VENV) .shardbus .pytest_cache
