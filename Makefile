# Two entry points, both self-contained on a fresh machine:
#   make run   - set up the virtualenv and run the main job (the broker on an embedded store under ./data)
#   make test  - set up the virtualenv and run the whole test suite, then ruff and mypy
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup browser run test bench clean etcd remoting-clients

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,spark,s3]'
	touch $(STAMP)

run: setup
	$(VENV)/bin/stratamq broker start --store ./data

# The cluster tests start their own etcd members: Debian's etcd-server, installed where missing
# (as root, as CI runs; quiet and nothing to do where etcd is on PATH); the partition test
# cuts a network namespace's link with `ip` (iproute2).
etcd:
	@command -v etcd >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; }
	@command -v ip >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }

# Byte-compiled once up front: the suite starts hundreds of Python processes (brokers, CLI
# calls, Spark workers), and where PYTHONDONTWRITEBYTECODE is set each would otherwise compile
# the package from source again (a stale .pyc is only recompiled in memory, never wrong).
# The web console's tests drive Debian's chromium through chromium-driver (Selenium): installed
# where missing (needs root, as the suite does); nothing is printed when both are there.
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium chromium-driver >/dev/null; fi

test: setup etcd remoting-clients browser
	$(PY) -m compileall -q stratamq
	$(PY) -m pytest -q -p no:cacheprovider
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The npm package ali-ons (a RocketMQ 4.x remoting client) for tests/test_remoting_ali_ons.py,
# pinned by tests/remoting/package-lock.json; installed once (node_modules is not committed).
remoting-clients:
	@command -v npm >/dev/null || (apt-get update && apt-get install -y nodejs npm)
	@[ -f tests/remoting/node_modules/ali-ons/package.json ] || \
		(cd tests/remoting && npm ci --no-audit --no-fund --loglevel=error)

bench: setup
	$(PY) bench/store.py

clean:
	rm -rf $(VENV) data tests/remoting/node_modules
