# The two commands a newcomer needs: `make up` (run the system) and `make test` (pass the
# tests). Both create .venv and install the project into it when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

# The machine's own, older servers (NATS 2.9, PostgreSQL 15) for the second generation run.
LOCAL_NATS_URL ?= nats://127.0.0.1:4222
LOCAL_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: lock up test test-unit test-integration test-system test-local-servers test-faults test-hosts iptables tcpdump test-model test-link-model test-schemathesis bench fault-runs soak docs clean browser promtool npm-tools lint engine images test-compose tls-certs

# Every package comes from requirements.lock, exact versions with their hashes (a release that
# changed under a version, or a package nothing asked for, is refused); the project itself is
# installed over it without dependencies. `make lock` refreshes the lock (docs/operations.md).
LOCK := requirements.lock
UV_VERSION := 0.13.9
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# The newest releases pyproject.toml allows, written into the lock with their hashes, installed,
# and the whole suite run on them: a refresh that breaks a test is seen before it lands. The
# image's requirements-runtime.lock (no test packages) follows it, at the same versions.
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(VENV)/bin/uv pip compile --quiet --upgrade --universal --python-version 3.11 --generate-hashes \
		--extra test pyproject.toml -o $(LOCK)
	$(VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
		-c $(LOCK) pyproject.toml -o requirements-runtime.lock
	$(MAKE) $(STAMP) test

# `make up` takes ports and the rest as make variables (each also read as SHARDBUS_<NAME> from
# the environment by `shardbus up` itself): make up SHARD_PORT=2595 NATS_PORT=4223 WEB_PORT=8080
# (also NATS_WS_PORT, POSTGRES_PORT, METRICS_PORT, REPLICAS=web=2,gateway=2, STATE_DIR=…). Without them, the
# previous start's ports are kept when free.
UP_ARGS = $(if $(STATE_DIR),--state-dir $(STATE_DIR)) \
	$(if $(SHARD_PORT),--shard-port $(SHARD_PORT)) \
	$(if $(NATS_PORT),--nats-port $(NATS_PORT)) \
	$(if $(NATS_WS_PORT),--nats-ws-port $(NATS_WS_PORT)) \
	$(if $(WEB_PORT),--web-port $(WEB_PORT)) \
	$(if $(POSTGRES_PORT),--postgres-port $(POSTGRES_PORT)) \
	$(if $(METRICS_PORT),--metrics-port $(METRICS_PORT)) \
	$(if $(REPLICAS),--replicas $(REPLICAS))

up: $(STAMP)
	$(VENV)/bin/shardbus up $(UP_ARGS)

# The suite's own `shardbus` commands must not take the addresses and tokens of a `make up`
# running in this directory (.shardbus/env, which every command reads): they are pointed at a
# state directory that does not exist.
NO_STACK := SHARDBUS_STATE_DIR=$(CURDIR)/.shardbus-not-for-tests

# The console's browser tests (tests/web/test_console_*.py) drive Debian's Chromium; this
# installs it when it is missing (root: apt-get), and fails when it cannot: a missing browser is
# a failed suite, never a skipped test.
CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || { echo "== installing Debian's chromium (the console's browser tests)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@test -x $(CHROMIUM) || { echo "no Chromium at $(CHROMIUM): apt-get install chromium" >&2; exit 1; }

# The monitoring files' checks (tests/deploy: promtool check config / check rules / test rules)
# need promtool, from Debian's prometheus package (about 30 s to install here; no PyPI package
# ships it); this installs it when missing and fails when it cannot: a missing promtool fails
# the suite, never skips it. (Where systemd runs, the package also starts a Prometheus on :9090:
# `systemctl disable --now prometheus` if it is not wanted; the tests use none.)
PROMTOOL ?= /usr/bin/promtool
promtool:
	@test -x $(PROMTOOL) || { echo "== installing Debian's prometheus (promtool, for tests/deploy)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@test -x $(PROMTOOL) || { echo "no promtool at $(PROMTOOL): apt-get install prometheus" >&2; exit 1; }

# compose.yaml for real (tests/deploy/test_compose_up.py, marked needs_engine; docs/operations.md,
# "Compose for real"): `make engine` installs Debian's podman, runc, docker-compose (which drives
# podman through its Docker API) and debootstrap when one is missing (root: apt-get, about 50 s),
# and fails when it cannot. `make images` builds the stand-ins for the images Docker Hub would
# give (deploy/images/build.sh: about 2.5 min the first time, seconds after). `make test-compose`
# runs the compose tests (the TLS files' too: tests/deploy/test_compose_tls.py) with
# SHARDBUS_REQUIRE_COMPOSE=1: a missing engine or image fails them, never skips. `make test`
# leaves them out and needs no engine.
engine:
	@for tool in podman runc docker-compose debootstrap; do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then echo "== installing Debian's podman, runc, docker-compose and debootstrap (compose tests)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc docker-compose debootstrap >/dev/null; fi
	@for tool in podman runc docker-compose debootstrap; do command -v $$tool >/dev/null || \
		{ echo "no $$tool: apt-get install podman runc docker-compose debootstrap" >&2; exit 1; }; done
images: engine
	deploy/images/build.sh
test-compose: $(STAMP) images
	$(NO_STACK) SHARDBUS_REQUIRE_COMPOSE=1 $(PY) -m pytest -p no:randomly -m needs_engine \
		tests/deploy/test_compose_up.py tests/deploy/test_compose_tls.py

# A trial's TLS certificates for compose.tls.yaml and compose.cluster-tls.yaml in TLS_DIR (./tls,
# the directory they mount): a CA made for the occasion, its key thrown away once they are signed
# (deploy/tls-certs.sh; docs/security.md, "TLS"). Production uses the operator's own CA.
TLS_DIR ?= tls
tls-certs:
	deploy/tls-certs.sh $(TLS_DIR)

# The AsyncAPI documents' check (tests/system/test_asyncapi_parser.py) runs the official AsyncAPI
# parser, an npm package: this installs tests/npm's exact versions (package-lock.json) into
# .npm-tools/ when they changed, and fails when it cannot: a missing tool is a failed suite,
# never a skipped test. Node and npm come from Debian's nodejs and npm packages when missing.
NPM_TOOLS := .npm-tools
NPM_STAMP := $(NPM_TOOLS)/node_modules/.package-lock.json
npm-tools: $(NPM_STAMP)
$(NPM_STAMP): tests/npm/package.json tests/npm/package-lock.json
	@command -v npm >/dev/null || { echo "== installing Debian's nodejs and npm (tests/npm's tools)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	@command -v npm >/dev/null || { echo "no npm: apt-get install nodejs npm" >&2; exit 1; }
	@mkdir -p $(NPM_TOOLS) && cp tests/npm/package.json tests/npm/package-lock.json $(NPM_TOOLS)/
	@echo "== installing tests/npm's tools into $(NPM_TOOLS)/"
	@cd $(NPM_TOOLS) && npm ci --no-audit --no-fund --silent || \
		{ echo "npm could not install tests/npm's tools into $(NPM_TOOLS)/" >&2; exit 1; }
	@touch $(NPM_STAMP)

# The suite runs in WORKERS pytest-xdist processes, a file to a worker (and every file that starts
# whole stacks on one worker, in turn: tests/conftest.py, STACK_GROUP): each worker starts its
# own nats-server and PostgreSQL (tests/conftest.py), so no two workers share a subject, a
# stream or a database. Most tests wait on servers rather than compute, so four workers on two
# cores take well under half the time of one (docs/architecture.md, "The test suite"). Servers
# named by SHARDBUS_TEST_NATS_URL / SHARDBUS_TEST_DATABASE_URL would be shared, so with them (or
# WORKERS=1) the suite runs in one process.
WORKERS ?= 4
PARALLEL = $(if $(SHARDBUS_TEST_NATS_URL)$(SHARDBUS_TEST_DATABASE_URL),,$(if $(filter-out 0 1,$(WORKERS)),-n $(WORKERS) --dist loadgroup))

# The fault suite (tests/faults, marked `faults`) runs on its own: make test-faults; so do the hosts
# scenarios (tests/hosts, marked `hosts`, root): make test-hosts, and the compose tests (marked
# `needs_engine`): make test-compose.
test: $(STAMP) browser promtool npm-tools
	$(NO_STACK) $(PY) -m pytest -m "not faults and not hosts and not needs_engine" $(PARALLEL)

# By cost (every test has one marker, given by tests/conftest.py): seconds, then minutes.
test-unit: $(STAMP)
	$(NO_STACK) $(PY) -m pytest -m unit
test-integration: $(STAMP)
	$(NO_STACK) $(PY) -m pytest -m integration $(PARALLEL)
test-system: $(STAMP) browser promtool npm-tools
	$(NO_STACK) $(PY) -m pytest -m "system and not needs_engine" $(PARALLEL)

# The same suite against already-running servers (CI: the machine's NATS and PostgreSQL). One
# process: workers would share these servers, and one worker's in-process ledger would answer
# another's requests from the wrong database.
test-local-servers: $(STAMP) browser promtool npm-tools
	$(NO_STACK) SHARDBUS_TEST_NATS_URL=$(LOCAL_NATS_URL) SHARDBUS_TEST_DATABASE_URL=$(LOCAL_DATABASE_URL) \
		$(PY) -m pytest -m "not faults and not hosts and not needs_engine"

test-faults: $(STAMP)
	$(NO_STACK) $(PY) -m pytest -m faults

# Services and a 3-node NATS cluster on hosts made of network namespaces, partitioned with
# iptables (tests/hosts, docs/reliability.md, "Hosts"). Needs root; elsewhere it is skipped with
# the reason, unless SHARDBUS_REQUIRE_HOSTS=1 (then it fails). One process: the scenarios
# take the machine's network setup for themselves. The capture test (tests/hosts/test_capture.py,
# docs/security.md, "TLS") records the hosts' traffic with Debian's tcpdump: `make tcpdump`
# installs it when missing (root: apt-get, a few seconds) and fails when it cannot; as root a
# missing tcpdump fails the test, never skips it. `make iptables` installs Debian's iptables the
# same way (every hosts test cuts links with it; a fresh machine may not have it).
# $(call debian_tool,<path>,<package>,<who needs it>): as root, install the Debian package when
# <path> is missing, and fail when it is still missing; elsewhere, do nothing (the tests say why).
define debian_tool
	@test -x $(1) || [ "$$(id -u)" != 0 ] || { echo "== installing Debian's $(2) ($(3))"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=300 -y -qq --no-install-recommends $(2) >/dev/null; }
	@test -x $(1) || [ "$$(id -u)" != 0 ] || { echo "no $(2) at $(1): apt-get install $(2)" >&2; exit 1; }
endef
IPTABLES ?= /usr/sbin/iptables
iptables:
	$(call debian_tool,$(IPTABLES),iptables,tests/hosts)
TCPDUMP ?= /usr/bin/tcpdump
tcpdump:
	$(call debian_tool,$(TCPDUMP),tcpdump,tests/hosts/test_capture.py)
test-hosts: $(STAMP) iptables tcpdump
	$(NO_STACK) $(PY) -m pytest -m hosts tests/hosts -s -p no:randomly

# The ledger's whole history against its reference model (tests/model), long: MODEL_EXAMPLES
# examples of up to MODEL_STEPS steps each, MODEL_FAULTS faults an example at most. `make test`
# runs the same test short (5 examples of 20 steps).
MODEL_EXAMPLES ?= 50
MODEL_STEPS ?= 100
MODEL_FAULTS ?= 3
test-model: $(STAMP)
	$(NO_STACK) SHARDBUS_MODEL_EXAMPLES=$(MODEL_EXAMPLES) SHARDBUS_MODEL_STEPS=$(MODEL_STEPS) \
		SHARDBUS_MODEL_FAULTS=$(MODEL_FAULTS) $(PY) -m pytest tests/model -s -p no:cacheprovider --timeout=0

# The shard link against its model (tests/gateway/test_shard_link_model.py), long:
# LINK_MODEL_EXAMPLES random examples, shrunk when one fails. `make test` runs 5, always the same.
LINK_MODEL_EXAMPLES ?= 60
test-link-model: $(STAMP)
	$(NO_STACK) SHARDBUS_LINK_MODEL_EXAMPLES=$(LINK_MODEL_EXAMPLES) $(PY) -m pytest \
		tests/gateway/test_shard_link_model.py -s -p no:cacheprovider --timeout=0

# The hosts scenarios' short form, for CI (docs/reliability.md, "Hosts", "The short form"): the
# few marked `hosts_short` (a partition, a node isolated, a kill during a partition, a lossy
# link, a gateway host isolated), about 4 minutes on 2 cores, under 10; .ci/run runs it. A fresh
# seed each run, printed with every scenario: SHARDBUS_HOSTS_SEED=<n> make test-hosts-short replays one.
.PHONY: test-hosts-short
test-hosts-short: $(STAMP) iptables
	$(NO_STACK) $(PY) -m pytest -m "hosts and hosts_short" tests/hosts -s -p no:randomly

# Schemathesis against a door on a real stack (tests/web/test_schemathesis.py, docs/web.md, "The
# OpenAPI document"), longer: SCHEMATHESIS_EXAMPLES examples per operation and phase (`make test`
# runs 5), both tokens.
SCHEMATHESIS_EXAMPLES ?= 100
test-schemathesis: $(STAMP)
	$(NO_STACK) SHARDBUS_SCHEMATHESIS_EXAMPLES=$(SCHEMATHESIS_EXAMPLES) SHARDBUS_SCHEMATHESIS_TIMEOUT_S=3600 \
		$(PY) -m pytest tests/web/test_schemathesis.py -p no:cacheprovider --timeout=0

# Lint and types (CI runs this): ruff over the tree, mypy strict on services/, shared/,
# shardbus/ and simulator/ (pyproject.toml holds both configurations).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Every bench but the many-shards helper (bench/gateway.py starts it) and the fault record.
BENCH_NOT_RUN := bench/shard_load.py bench/fault_runs.py
bench: $(STAMP)
	@set -e; for script in $(filter-out $(BENCH_NOT_RUN),$(sort $(wildcard bench/*.py))); do \
		echo "== $$script"; $(PY) $$script; done

# The fault suite RUNS times in a row, every output under bench/results/faults/ (issue 29).
RUNS ?= 5
fault-runs: $(STAMP)
	$(PY) bench/fault_runs.py --runs $(RUNS)

# The soak: the whole embedded stack under steady load for MINUTES (figures in
# docs/performance.md, "Soak"); `make bench` runs it for its default 1 minute.
MINUTES ?= 10
soak: $(STAMP)
	$(PY) bench/soak.py --minutes $(MINUTES)

# The README's settings table, each service's AsyncAPI document (every subject it serves,
# with its payload schema) and the web door's OpenAPI document, all generated from the code.
# The services and their app factories come from shardbus/registry.py ("NAME FACTORY" lines).
docs: $(STAMP)
	$(PY) -m shardbus.settings_catalog --update README.md
	@mkdir -p docs/asyncapi
	@set -e; documented=$$($(PY) -m shardbus.registry --asyncapi); \
	echo "$$documented" | while read -r service factory; do \
		$(VENV)/bin/faststream docs gen --factory "$$factory" \
			--out docs/asyncapi/$$service.json >/dev/null; \
		$(PY) -m shardbus.asyncapi_docs docs/asyncapi/$$service.json; \
		echo "docs/asyncapi/$$service.json"; done
	$(PY) -m services.web.openapi --out docs/openapi/web.json

clean:
	rm -rf $(VENV) .shardbus .pytest_cache
