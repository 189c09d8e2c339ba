# bkref: one command sets everything up (`make setup`), and every target that
# needs the virtualenv depends on it, so `make verify` works on a new machine.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# pytest workers for `make verify` on the 2-core CI machine: twice the cores, as much of
# the suite waits on ZooKeeper, fsyncs and child processes. Beside the mutation run's
# two model-checker processes, 4 workers took a fresh clone's verify from 36:53 (3
# workers, 3 tests failed on load races since fixed) to 33:01, green; beside two busy
# loops, 24:36, green (2026-11-29). At 2202426, fresh clones: 21:04 quiet, 26:50 beside
# two busy loops, both green. On the AMD machines of 2026-11-30 the suite had grown and
# the machine was slower: 43.7 min at 697fbb7, 35.1 at f6a75b6, both cores busy to the
# end; after cuts, 25.1 and 23.7 min quiet, 38.4 beside two busy loops, all green; after
# more, 22.5 min quiet and 26.6 beside two busy loops at 8065862, green (2026-12-01;
# BENCHMARKS.md, 'make verify'). A test module runs whole on one worker
# (--dist loadfile; the Spark session's modules together, tests/xdist_scheduling.py), so
# module fixtures are shared as before.
TEST_WORKERS ?= 4
STAMP := $(VENV)/.bkref-installed
# Debian packages the project runs for real: ZooKeeper (metadata), iptables,
# nftables and iproute2 (network faults in campaigns), libfuse2 (lazyfs, the
# disk that loses unsynced writes).
APT_PACKAGES := zookeeper iptables nftables iproute2 libfuse2 chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

ZK_DEMO_DIR ?= out/zookeeper-demo

.PHONY: verify-full mutation install-check crosshair spec-build spec-build-equal spec-check spec-big spec-coverage refine campaign planted zookeeper-demo bench bench-smoke setup system-packages test verify lint typecheck contracts clean help docker-setup docker-images docker-smoke docker-campaign docker-planted spark-cluster-test spec-check-spark

help:
	@echo "make campaign  the main job: a fault campaign on a local cluster, its checks and report"
	@echo "make planted   campaigns with each planted bug on: are they all caught? (up to 3 runs each)"
	@echo "make setup     install system packages and the .venv (idempotent)"
	@echo "make zookeeper-demo  start a private 3-node ZooKeeper ensemble, show it, stop it"
	@echo "make test      fast test suite (no slow tests)"
	@echo "make bench     benchmarks; results go to BENCHMARKS.md"
	@echo "make mutation  mutation testing (cosmic-ray): a sample of the spec's mutants; docs/mutation.md"
	@echo "make spec-check  every named config checked exhaustively, with coverage (~12 min)"
	@echo "make spec-build  compile the checker's modules with mypyc (bkref/spec/build.py)"
	@echo "make spec-build-equal  the compiled build against the source on every config"
	@echo "make spec-coverage  the same coverage as JSON in out/spec-coverage.json"
	@echo "make spec-big  the configs too big for spec-check, with fingerprints (see BENCHMARKS.md);"
	@echo "               checkpoints in out/spec-big/: run it again after a stop to go on"
	@echo "make refine    the spec held against bkref step by step, every config it runs (minutes)"
	@echo "make docker-setup  install Debian's docker.io and debootstrap (the Docker backend)"
	@echo "make docker-images  build the node image bkref-node:latest in the private engine"
	@echo "make docker-smoke  the Docker tests (engine, image, a short campaign), or why not"
	@echo "make docker-planted  every planted bug, each caught on the Docker backend"
	@echo "make docker-campaign  a default-length campaign on the Docker backend (CAMPAIGN_ARGS too)"
	@echo "make spark-cluster-test  spark-check on a real standalone Spark cluster on 127.0.0.1 vs local[2]"
	@echo "make spec-check-spark  every named spec config's BFS on Spark (local[2]) against the local checker"
	@echo "make install-check  pip install . into a fresh venv; bkref runs from outside the checkout"
	@echo "make verify    ruff, mypy --strict, import contracts, install-check, the whole test suite (what CI runs)"
	@echo "make verify-full  the tests verify leaves out for time (marked full): long forms of its checks"

setup: system-packages $(STAMP)

system-packages:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	if [ -n "$$missing" ]; then \
	  echo "make setup: installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else \
	  echo "make setup: Debian packages present ($(APT_PACKAGES), java)"; \
	fi

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Re-install when the project's metadata changes (dependencies, entry points).
$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The Docker backend's engine and image builder (idempotent, like system-packages).
DOCKER_PACKAGES := docker.io debootstrap
docker-setup: setup
	@missing=""; \
	for p in $(DOCKER_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make docker-setup: installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else \
	  echo "make docker-setup: Debian packages present ($(DOCKER_PACKAGES))"; \
	fi

# Cold: debootstrap from the Debian mirror (~4 min); cached: seconds.
docker-images: docker-setup
	$(VENV)/bin/bkref docker build

# What `make verify` runs for Docker. Either the tests marked `docker` run and
# must pass, or this says exactly why the engine cannot start here (never silent).
DOCKER_SMOKE_DIR ?= /tmp/bkref-docker-smoke
docker-smoke: setup
	@if [ "$$(id -u)" != 0 ]; then \
	  echo "make docker-smoke: NOT RUN: the private Docker engine needs root"; exit 0; \
	fi; \
	$(MAKE) --no-print-directory docker-setup || { echo "make docker-smoke: NOT RUN: make docker-setup failed (apt)"; exit 0; }; \
	if ! why=$$($(VENV)/bin/bkref docker engine start --dir $(DOCKER_SMOKE_DIR) 2>&1); then \
	  echo "make docker-smoke: NOT RUN: the Docker engine cannot start here:"; echo "$$why"; \
	  $(VENV)/bin/bkref docker engine stop --dir $(DOCKER_SMOKE_DIR); exit 0; \
	fi; \
	$(VENV)/bin/bkref docker engine stop --dir $(DOCKER_SMOKE_DIR) >/dev/null; \
	$(VENV)/bin/pytest -q -m docker tests/docker -k 'not planted'

# Kept out of verify for time (a cold image build already costs ~5 min there).
docker-planted: docker-setup
	$(VENV)/bin/pytest -q -m docker tests/docker -k planted

docker-campaign: docker-images
	$(VENV)/bin/bkref campaign --backend docker $(CAMPAIGN_ARGS)

# What a user of bkref as a library does: `pip install .` (not editable) into a new venv,
# dependencies from PyPI. Only the `bkref` namespace is installed, and the command works
# from outside the checkout. `make verify` runs it (~30 s with pip's cache warm from setup);
# the suite checks the same on the wheel without network (tests/unit/test_packaging.py).
INSTALL_CHECK_DIR ?= $${TMPDIR:-/tmp}/bkref-install-check
install-check:
	rm -rf $(INSTALL_CHECK_DIR) && $(PYTHON) -m venv $(INSTALL_CHECK_DIR)/venv
	$(INSTALL_CHECK_DIR)/venv/bin/pip install -q --upgrade pip
	$(INSTALL_CHECK_DIR)/venv/bin/pip install -q .
	cp tests/data/peer-histories/jepsen/etcd_002.log $(INSTALL_CHECK_DIR)/history.log
	cd $(INSTALL_CHECK_DIR) && venv/bin/python -c "import bkref.spec, bkref.linearizability"
	cd $(INSTALL_CHECK_DIR) && ! venv/bin/python -c "import spec" 2>/dev/null
	cd $(INSTALL_CHECK_DIR) && venv/bin/bkref check history.log
	cd $(INSTALL_CHECK_DIR) && venv/bin/bkref spec check --config c --quiet
	@echo "make install-check: OK ($(INSTALL_CHECK_DIR))"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

contracts: setup
	$(VENV)/bin/lint-imports

test: setup
	$(VENV)/bin/pytest -q -m 'not slow'

# The spec's pure helpers carry PEP 316 contracts; crosshair proves them symbolically.
# Most of its 7 functions use the whole time per condition (62 CPU s at 10 s); `make
# verify` gives each 5 s (CROSSHAIR_TIMEOUT=5), `make crosshair` alone 10.
CROSSHAIR_TIMEOUT ?= 10
crosshair: setup
	BKREF_SPEC=pure $(VENV)/bin/crosshair check --analysis_kind=PEP316 --per_condition_timeout=$(CROSSHAIR_TIMEOUT) bkref/spec/quorum.py

# Exhaustive checks of the full named configs (a, b, c): a and b take 1-2 minutes each with
# both cores at low load (0.9M and 1.7M states); not part of `verify`.
# Which actions and branches of the spec the named configs reach (bkref/spec/coverage.py);
# exits 1 while a branch no config reaches has no recorded reason. Every config, ~10 min.
# Every named config checked exhaustively, counting the actions, branches and races it
# reaches; fails on a violation, on a branch unreached without a recorded reason and on a
# pair of metadata writers racing in no config. Writes docs/coverage.md.
spec-check: spec-build
	$(VENV)/bin/bkref spec coverage --markdown docs/coverage.md

# The spec's core modules compiled by mypyc (bkref/spec/build.py), used by every later spec
# run while their source is unchanged; without mypyc or a C compiler the spec runs as Python.
spec-build: setup
	$(VENV)/bin/bkref spec build || echo "make spec-build: no build; the spec runs as pure Python"

# The build against the source: every named config, every mutant, every stored trace.
spec-build-equal: setup
	BKREF_SPEC_EQUAL=all $(VENV)/bin/pytest -q --timeout 0 -n 2 tests/spec/test_build.py

# The configs too big for spec-check (bkref/spec/configs.py BIG_CONFIGS), with fingerprints.
spec-big: spec-build
	for c in a3 a-crash a-recoveries-loss; do PYTHONHASHSEED=1 $(VENV)/bin/bkref spec check --fingerprints --workers 2 --checkpoint out/spec-big/$$c --config $$c || exit 1; done

# The same as JSON, for tools: out/spec-coverage.json.
spec-coverage: setup
	mkdir -p out
	$(VENV)/bin/bkref spec coverage --json > out/spec-coverage.json

# The refinement machine (bkref/refine/, docs/refine.md), long: every config bkref's driver runs,
# REFINE_EXAMPLES examples each, then each planted bug it can exercise. `make verify` runs
# short versions of both (tests/refine/).
REFINE_EXAMPLES ?= 2000
refine: setup
	$(VENV)/bin/bkref refine --examples $(REFINE_EXAMPLES)
	for p in recovery-reads-without-fence:a-short ack-before-fsync:m-journal bookie-forgets-lac-on-replay:b repair-without-copy:c-short repair-open-segment-without-fence:m-open-segment acks-from-replaced-bookie-count:m-4651 ensemble-change-undoes-swap:m-merge-writer recovery-piggybacks-its-own-lac:a-readers; do \
	  $(VENV)/bin/bkref refine --config $${p#*:} --examples 2000 --plant $${p%%:*}; \
	  test $$? -eq 1 || { echo "make refine: planted $${p%%:*} was not caught"; exit 1; }; \
	done

# The static checks and smoke runs (side by side, each target's output kept together) and
# the Docker smoke run beside the suite, their output printed after the suite's. Before
# it, they took 4.5 minutes of a loaded run's 40 while leaving CPU to the other jobs; the
# smoke mostly waits on its engine and containers, as the suite does on ZooKeeper,
# fsyncs and child processes (one after the other, they kept the 2 cores 61% busy).
VERIFY_LOG_DIR ?= $${TMPDIR:-/tmp}/bkref-verify
VERIFY_CHECKS := lint typecheck contracts crosshair install-check bench-smoke
verify: setup
	@mkdir -p $(VERIFY_LOG_DIR); \
	echo "the static checks and smoke runs, and make docker-smoke, go beside the suite;"; \
	echo "their output follows the suite's"; \
	$(MAKE) --no-print-directory -j3 -O $(VERIFY_CHECKS) CROSSHAIR_TIMEOUT=5 > $(VERIFY_LOG_DIR)/checks.log 2>&1 & checks=$$!; \
	$(MAKE) --no-print-directory docker-smoke > $(VERIFY_LOG_DIR)/docker-smoke.log 2>&1 & smoke=$$!; \
	$(VENV)/bin/pytest -q -m 'not docker and not full' -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25; \
	rc=$$?; wait $$checks; checks_rc=$$?; wait $$smoke; smoke_rc=$$?; \
	echo "== make $(VERIFY_CHECKS) (exit $$checks_rc):"; cat $(VERIFY_LOG_DIR)/checks.log; \
	echo "== make docker-smoke (exit $$smoke_rc):"; cat $(VERIFY_LOG_DIR)/docker-smoke.log; \
	test $$rc -eq 0 -a $$checks_rc -eq 0 -a $$smoke_rc -eq 0

# The tests marked `full`: the long forms of checks verify holds in shorter ones (a planted
# campaign whose plant the refinement machine catches in verify, the same seed's control
# run without a plant, a mutant's own config where verify catches it on a smaller one, a
# second job on the standalone Spark cluster, a history whose case another covers). Left
# out of verify for its time: the suite is CPU-bound on the 2-core CI machine
# (BENCHMARKS.md, 'make verify', has both targets' times).
verify-full: setup
	$(VENV)/bin/pytest -q -m 'full and not docker' -n $(TEST_WORKERS) --dist loadfile --durations=10

# A standalone Spark master and worker on 127.0.0.1 (bkref/spark_checks/standalone.py):
# spark-check's verdicts there equal local[2]'s. Marked slow: `make verify` runs it but for
# its test marked full (a second pair of jobs), which `make verify-full` runs too.
spark-cluster-test: setup
	$(VENV)/bin/pytest -q tests/spark_checks/test_cluster.py

# Every named config's BFS on Spark (local[2]; bkref/spark_checks/spec_bfs.py) against the
# local checker: the same distinct states, transitions, depth and verdict, or exit 1.
spec-check-spark: setup
	$(PY) -m tests.spark_checks.spec_check_spark

bench: setup
	$(PY) -m tests.bench

# A small real run of every benchmark, so `make verify` proves they still work.
bench-smoke: setup
	$(PY) -m tests.bench --quick --out $${TMPDIR:-/tmp}/bkref-BENCHMARKS.smoke.md

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

# Mutation testing (tests/mutation, cosmic-ray): a uniform sample of the spec's mutants against
# spec-check's verdicts, then the core's against its tests; rewrites docs/mutation.md.
# Resumable: run it again to go on. MUTATION_ARGS passes options, e.g. "--budget 3600".
MUTATION_ARGS ?=
mutation: setup
	$(PY) -m tests.mutation run spec $(MUTATION_ARGS)
	$(PY) -m tests.mutation run core $(MUTATION_ARGS)

# The main job. CAMPAIGN_ARGS passes options, e.g. CAMPAIGN_ARGS="--time 300 --runs 3 --seed 7".
CAMPAIGN_ARGS ?=
campaign: setup
	$(VENV)/bin/bkref campaign $(CAMPAIGN_ARGS)

# Each planted bug (bkref/impl/core/planted.py) in campaigns of the default length until caught.
planted: setup
	$(VENV)/bin/python -m bkref.nemesis.planted $(PLANTED_ARGS)

zookeeper-demo: setup
	rm -rf $(ZK_DEMO_DIR)
	$(VENV)/bin/bkref zookeeper start --dir $(ZK_DEMO_DIR) --size 3
	$(VENV)/bin/bkref zookeeper status --dir $(ZK_DEMO_DIR); \
	status=$$?; $(VENV)/bin/bkref zookeeper stop --dir $(ZK_DEMO_DIR); exit $$status
