# Agent-Reach — every target installs what it needs into .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast browser-deps lint bench stop clean screenshots

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU wheel of torch first: otherwise sentence-transformers pulls GBs of CUDA.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: install
	$(PY) -m reach_platform.devserver

# Everything, browser tests included (installs Debian's chromium first when it is missing and may be installed).
test: install browser-deps
	$(PY) -m pytest -q -p no:randomly; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

# Without the browser tests (marker `browser`): no Chromium needed.
test-fast: install
	$(PY) -m pytest -q -p no:randomly -m "not browser"; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

browser-deps:
	@.ci/chromium.sh

# The README's screenshots (dashboard, onboarding, governance), taken by the browser tests in headless Chromium.
screenshots: install browser-deps
	REACH_SCREENSHOTS_DIR=docs/screenshots $(PY) -m pytest -q -p no:randomly tests/browser

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run

stop:
	-$(PY) -c "import pgserver; from reach_platform.local_services import DATA_DIR; \
	  from pgserver._commands import pg_ctl; pg_ctl(['-w','stop'], pgdata=DATA_DIR/'pg', user='pgserver')"

clean: stop
	rm -rf $(VENV) .data staticfiles
