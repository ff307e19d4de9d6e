# `make run` and `make test` are the two ways in (README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: install run test lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py sync_prices
	$(PY) manage.py seed_demo --if-empty
	$(PY) manage.py ensure_admin
	@echo "Costboard on http://127.0.0.1:$(PORT)/"
	$(VENV)/bin/gunicorn costboard.wsgi --bind 127.0.0.1:$(PORT) --workers 2 --threads 4 \
		--access-logfile -

test: install
	$(VENV)/bin/pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

bench: install
	$(PY) manage.py bench_ingest
	$(PY) manage.py bench_pages
