# Two commands from a fresh clone: `make demo` and `make test`.
# Each creates .venv with python3.11 on first use. `make demo` installs the
# package (editable) with only its runtime dependencies; `make test` adds the
# test, parity and text extras (pytest, hypothesis, transformers, tokenizers). Stamp files make
# later runs skip the install until pyproject.toml changes.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pto-installed
TSTAMP := $(VENV)/.pto-test-installed

.PHONY: demo test test-slow bench venv clean-venv

demo: $(STAMP)
	$(VENV)/bin/pto demo
	@set -e; d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
	$(VENV)/bin/pto checkpoint tiny "$$d/tiny" --seed 0 --mtp; \
	$(VENV)/bin/pto generate "$$d/tiny" --input-ids "5 17 300 42 7 99" --max-new-tokens 8 --weights int8 --mtp
	$(VENV)/bin/pto graph --model flash --stage decode

test: $(TSTAMP)
	$(PY) -m pytest -q

test-slow: $(TSTAMP)
	$(PY) -m pytest -q -m slow

bench: $(TSTAMP)
	@set -e; for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f; done

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e .
	@touch $(STAMP)

$(TSTAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,parity,text]'
	@touch $(TSTAMP)

clean-venv:
	rm -rf $(VENV)
