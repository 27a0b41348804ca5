# Every target sets itself up from nothing: a virtualenv in .venv, mqlog installed
# editable with its test extra, and the C extension built in place.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.mqlog-setup
EXT_SOURCES := setup.py $(wildcard mqlog/ext/*.pyx mqlog/ext/*.pxi mqlog/ext/*.pxd mqlog/ext/*.h)
EXT_STAMP := $(VENV)/.mqlog-ext

.PHONY: setup demo test test-fast bench lint clean

setup: $(EXT_STAMP)

$(SETUP_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet "setuptools>=68,<81" wheel "Cython==3.3.1"
	$(PY) -m pip install --quiet --no-build-isolation -e '.[test,bench,spark]'
	touch $@

$(EXT_STAMP): $(SETUP_STAMP) $(EXT_SOURCES)
	$(PY) setup.py --quiet build_ext --inplace
	touch $@

demo: setup
	MQLOG_REQUIRE_EXTENSION=1 $(PY) -m mqlog.demo

test: setup
	MQLOG_REQUIRE_EXTENSION=1 $(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	MQLOG_REQUIRE_EXTENSION=1 $(PY) -m pytest benchmarks --benchmark-only -q $(PYTEST_ARGS)
	MQLOG_REQUIRE_EXTENSION=1 $(PY) -m benchmarks.compare
	MQLOG_REQUIRE_EXTENSION=1 $(PY) -m benchmarks.replication
	MQLOG_REQUIRE_EXTENSION=1 $(PY) -m benchmarks.raft --seconds 2
	MQLOG_REQUIRE_EXTENSION=1 $(PY) -m benchmarks.isr

lint: setup
	$(PY) -m ruff check mqlog tests benchmarks
	PATH=$(VENV)/bin:$$PATH cython-lint mqlog/ext

clean:
	rm -rf $(VENV) build mqlog/ext/*.so mqlog/ext/*.c .pytest_cache .hypothesis
