# `make run` and `make test` are the two ways in (README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: install static run test lint bench

# The client is its own distribution, not on PyPI: installed from the checkout, beside the server.
$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ./clients/python -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Hashed, gzip- and brotli-compressed static files (about a minute, for plotly.js): made again
# only when our static files or the installed packages change.
STATIC_SOURCES := $(shell find static -type f 2>/dev/null)
staticfiles/staticfiles.json: $(VENV)/.installed $(STATIC_SOURCES)
	$(PY) manage.py collectstatic --noinput --verbosity 0
	touch $@

static: staticfiles/staticfiles.json

run: install static
	$(PY) manage.py migrate --noinput
	$(PY) manage.py sync_prices
	$(PY) manage.py seed_demo --if-empty
	$(PY) manage.py ensure_admin
	@echo "Costboard on http://127.0.0.1:$(PORT)/"
	@# the periodic jobs (runaway sweep, retention) beside the server: Celery beat's work
	@# when there is no broker; with one, run `celery -A costboard worker --beat` instead.
	@# No request-line limit in gunicorn: the API answers a query string past 8 KB with its
	@# own JSON 414, which gunicorn's 4 KB default would pre-empt with a bare 400.
	$(PY) manage.py guard_sweep --every 60 & sweep=$$!; trap "kill $$sweep" EXIT INT TERM; \
	$(VENV)/bin/gunicorn --config python:costboard.gunicorn_conf costboard.wsgi --bind 127.0.0.1:$(PORT) --workers 2 --threads 4 \
		--limit-request-line 0 --access-logfile -

test: install
	$(VENV)/bin/pytest

lint: install
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

bench: install
	$(PY) manage.py bench_ingest
	$(PY) manage.py bench_pages
