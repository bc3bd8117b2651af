# Two commands from a fresh clone: `make demo` and `make test`.
# Each creates .venv with python3.11 on first use and installs the package
# (editable) with its test and parity extras; a stamp file makes later runs
# skip the install until pyproject.toml changes.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pto-installed

.PHONY: demo test test-slow bench venv clean-venv

demo: $(STAMP)
	$(VENV)/bin/pto demo

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	@set -e; for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f; done

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,parity]'
	@touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
