# tidelog: `make demo` runs the main job, `make test` runs every check CI runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_JOBS ?= 2
QUICK_STAMP := $(VENV)/.installed-quick
JS_STAMP := tests/js/node_modules/.installed

.PHONY: setup demo test quick lint typecheck unit bench clean java kcat cc chromium node sim-sweep soak fuzz \
  spark-kills dist wheel-check upgrade-soak txn-soak

setup: $(STAMP) $(JS_STAMP)

$(STAMP): pyproject.toml $(wildcard src/tidelog/record/*.c src/tidelog/record/*.h) | java kcat cc chromium
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==24.3.1
	$(BIN)/python -m pip install --quiet -e '.[spark,dev]'
	@touch $(STAMP)

# kafkajs (tests/js, pinned by its package-lock.json) is one of the Kafka clients the client
# library tests use: node.js and npm are expected on the machine, installed with apt if missing.
$(JS_STAMP): tests/js/package.json tests/js/package-lock.json | node
	cd tests/js && npm ci --no-audit --no-fund --loglevel=error
	@touch $(JS_STAMP)

node:
	@command -v npm >/dev/null 2>&1 || { \
	  echo "npm not found: installing nodejs and npm"; \
	  (sudo -n true 2>/dev/null && SUDO=sudo || SUDO=); \
	  $$SUDO apt-get install -y -qq nodejs npm || { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq nodejs npm; }; }

# Spark needs a JVM: Java 17 is expected on the machine, installed with apt if missing.
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "java not found: installing openjdk-17-jre-headless"; \
	  (sudo -n true 2>/dev/null && SUDO=sudo || SUDO=); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq openjdk-17-jre-headless; }

# The record scan and decoder are C extensions: gcc and the Python headers (python3-dev) are
# expected on the machine, installed with apt if the compiler is missing.
cc:
	@command -v gcc >/dev/null 2>&1 || { \
	  echo "gcc not found: installing it"; \
	  (sudo -n true 2>/dev/null && SUDO=sudo || SUDO=); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq gcc python3-dev; }

# kcat (Debian's package) is one of the Kafka clients the Kafka listener's tests use.
kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  echo "kcat not found: installing it"; \
	  (sudo -n true 2>/dev/null && SUDO=sudo || SUDO=); \
	  $$SUDO apt-get install -y -qq kcat || { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq kcat; }; }

# The console's browser test (tests/test_console.py) drives Debian's chromium with Playwright;
# Playwright's own browser download is never used.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "chromium not found: installing it"; \
	  (sudo -n true 2>/dev/null && SUDO=sudo || SUDO=); \
	  $$SUDO apt-get install -y -qq chromium || { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; }; }

demo: setup
	$(BIN)/tidelog demo

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: setup
	$(BIN)/mypy

# Three runs: the in-process tests (CPU-bound, no clocks to meet) on every core at once; the
# tests that start processes and Spark, two at a time (a module's tests stay together on one
# worker, sharing its cluster); then the `timed` ones (a wall-clock bound, or a set time of load:
# pyproject.toml's markers) one at a time, as their bounds assume.
unit: setup
	$(BIN)/pytest -q -n $(TEST_JOBS) -m "not process and not spark" --durations=5
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist loadscope -m "(process or spark) and not timed" \
	  --durations=12
	$(BIN)/pytest -q -m "(process or spark) and timed" --durations=12

# The inner loop: every in-process test (record, codec, validation, protocol, storage,
# replication with a few simulator seeds, the golden scenarios, the tidy check), in under a
# minute. It installs only the `quick` extra (no Spark, Java, browser or node.js) unless the
# full setup is there; a test it runs that starts a process or opens a socket fails.
quick:
	@test -f $(STAMP) || $(MAKE) --no-print-directory $(QUICK_STAMP)
	TIDELOG_QUICK=1 $(BIN)/pytest -q -n $(TEST_JOBS) -m "not process and not spark and not slow" \
	  -p no:cacheprovider --durations=5

$(QUICK_STAMP): pyproject.toml $(wildcard src/tidelog/record/*.c src/tidelog/record/*.h) | cc
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==24.3.1
	$(BIN)/python -m pip install --quiet -e '.[quick]'
	@touch $(QUICK_STAMP)

test: lint typecheck unit

# A long simulator sweep over fresh seeds (not part of `make test`): every core, each failure
# printed with the command that replays it. SWEEP_START=random draws a start above every fixed
# range and prints it.
SWEEP_SEEDS ?= 100000
SWEEP_START ?= random
sim-sweep: setup
	$(BIN)/python -m tidelog.testing --seeds $(SWEEP_SEEDS) --start $(SWEEP_START) --jobs 0

# The coverage-guided fuzzer of every decoder, longer than CI's 20 s, then its corpus against a
# live node (tests/test_fuzz_decoders.py); figures printed. FUZZ_SECONDS=3600 for an hour.
FUZZ_SECONDS ?= 600
fuzz: setup
	TIDELOG_DECODER_FUZZ_SECONDS=$(FUZZ_SECONDS) $(BIN)/pytest -q -s tests/test_fuzz_decoders.py

# The checks from outside, longer than CI runs them: the kill/pause nemesis, real network
# partitions (needs `unshare -rn`) and the protocol fuzzer, SOAK_SECONDS each.
SOAK_SECONDS ?= 300
soak: setup
	TIDELOG_SOAK_SECONDS=$(SOAK_SECONDS) TIDELOG_PARTITION_SECONDS=$(SOAK_SECONDS) \
	  TIDELOG_FUZZ_SECONDS=$(SOAK_SECONDS) $(BIN)/pytest -q -s -p no:cacheprovider \
	  tests/test_jepsen.py tests/test_network_partitions.py tests/test_fuzz.py

# Kafka transactions under faults for TXN_SOAK_SECONDS each: the kill/pause nemesis of
# tests/test_jepsen_transactions.py (CI runs 25 s), then real network partitions
# (tests/txn_netlab.py, needs `unshare -rn`; CI runs 40 s); each prints the anomalies found by
# name.
TXN_SOAK_SECONDS ?= 300
TXN_SEED ?= 1
txn-soak: setup
	TIDELOG_TXN_SOAK_SECONDS=$(TXN_SOAK_SECONDS) TIDELOG_TXN_NETNS_SECONDS=$(TXN_SOAK_SECONDS) \
	  TIDELOG_TXN_SEED=$(TXN_SEED) $(BIN)/pytest -q -s -rs -p no:cacheprovider \
	  tests/test_jepsen_transactions.py

# The Spark streaming kill test with SPARK_KILLS drivers SIGKILLed mid-run, each at whatever
# point it reached, besides the crash point's driver and the leader that every run kills.
SPARK_KILLS ?= 3
spark-kills: setup
	TIDELOG_SPARK_DRIVER_KILLS=$(SPARK_KILLS) $(BIN)/pytest -q -s tests/test_spark.py \
	  -k test_streaming_exactly_once_through_leader_and_driver_kills

# The rolling upgrade from the previous release (tests/test_upgrade.py, which `make test` runs with
# 20 s of load) under UPGRADE_SECONDS of load, spread over its five restarts.
UPGRADE_SECONDS ?= 300
upgrade-soak: setup
	TIDELOG_UPGRADE_LOAD_SECONDS=$(UPGRADE_SECONDS) $(BIN)/pytest -q -s -p no:cacheprovider \
	  tests/test_upgrade.py

# A release's files (docs/releasing.md): the sdist, then the wheel built from it (with the compiled
# record codecs and the commit the sdist names), both in dist/. The wheel is then retagged so pip
# installs it on other machines: manylinux by auditwheel (py3-none-any if built without the
# codecs), by tests/portable_wheel.py, which tests/test_wheel.py runs too.
dist: setup
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python tests/portable_wheel.py dist
	@ls -l dist

# The wheel installed into a fresh virtual environment outside the checkout, then serve, the
# client, cluster up and the Spark source run from it (tests/test_wheel.py; `make test` runs it
# too).
wheel-check: setup
	$(BIN)/pytest -q -p no:cacheprovider tests/test_wheel.py --durations=0

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist
