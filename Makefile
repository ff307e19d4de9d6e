# `make run` and `make test` are the two ways in (README.md). Every stage prints a line when it
# starts and at least every 10 s while it runs (devtools/stage.py).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
STAGE := $(PYTHON) devtools/stage.py
PIP := $(VENV)/bin/pip install --quiet --disable-pip-version-check

.PHONY: install install-dev static run test test-fast test-pgbouncer lint bench

# The client is its own distribution, not on PyPI: installed from the checkout, beside the
# server. `make run` needs only the server's packages; the test and lint tools come with
# `make test` (or `make lint`).
$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml
	@$(STAGE) "install: Costboard and its client into $(VENV)" -- sh -c \
		'$(PYTHON) -m venv $(VENV) && $(PIP) -e ./clients/python -e .'
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	@$(STAGE) "install: the test and lint tools" -- $(PIP) -e ./clients/python -e '.[dev]'
	@touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# Hashed, gzip- and brotli-compressed static files (costboard/static_storage.py; about 10 s):
# made again only when our static files or the installed packages change.
STATIC_SOURCES := $(shell find static -type f 2>/dev/null)
staticfiles/staticfiles.json: $(VENV)/.installed $(STATIC_SOURCES)
	@$(STAGE) "static files: hashed, gzip and brotli (staticfiles/)" -- \
		$(PY) manage.py collectstatic --noinput --verbosity 1
	@touch $@

static: staticfiles/staticfiles.json

run: install static
	@$(STAGE) "migrate the database" -- $(PY) manage.py migrate --noinput
	@$(STAGE) "prices from genai-prices (offline)" -- $(PY) manage.py sync_prices
	@$(STAGE) "demo data (into an empty database only)" -- $(PY) manage.py seed_demo --if-empty
	@$(STAGE) "admin login" -- $(PY) manage.py ensure_admin
	@echo "==> Costboard on http://127.0.0.1:$(PORT)/ (Ctrl-C stops it)"
	@# the periodic jobs (runaway sweep, retention) beside the server: Celery beat's work
	@# when there is no broker; with one, run `celery -A costboard worker --beat` instead.
	@# No request-line limit in gunicorn: the API answers a query string past 8 KB with its
	@# own JSON 414, which gunicorn's 4 KB default would pre-empt with a bare 400.
	@$(PY) manage.py guard_sweep --every 60 & sweep=$$!; trap "kill $$sweep" EXIT INT TERM; \
	$(VENV)/bin/gunicorn --config python:costboard.gunicorn_conf costboard.wsgi --bind 127.0.0.1:$(PORT) --workers 2 --threads 4 \
		--limit-request-line 0 --access-logfile -

# The suite on pytest-xdist: a worker per core, each with a test database of its own (SQLite
# files under var/, or test_<name>_gw<N> on PostgreSQL), idle workers stealing queued tests.
# On 2 cores a third worker gained nothing (6.5 min either way on PostgreSQL).
# TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= auto
PYTEST := $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal

test: install-dev
	$(PYTEST)

# The edit loop: everything but the tests marked slow (browsers, servers, migration walks,
# the fuzzers); under two minutes.
test-fast: install-dev
	$(PYTEST) -m "not slow"

# Ingest, the 16-client budget test and the pages through a PgBouncer in transaction mode that
# the tests start (docs/operations.md, "Connection pooler"): PostgreSQL (DATABASE_URL) and
# Debian's pgbouncer needed; CI runs it after `make test` on PostgreSQL.
POOLED_TESTS := tests/costboard/ingest/test_concurrency.py \
	tests/costboard/budgets/test_period_decisions.py::test_sixteen_concurrent_clients_cross_once \
	tests/costboard/budgets/test_period_thresholds.py::test_sixteen_concurrent_clients_cross_each_fraction_once \
	tests/costboard/dashboards/test_pages.py \
	tests/costboard/dashboards/test_dashboards.py::test_csv_export_of_the_filtered_list

test-pgbouncer: install-dev
	COSTBOARD_DB_POOLER=pgbouncer COSTBOARD_TEST_PGBOUNCER=1 $(PYTEST) $(POOLED_TESTS)

lint: install-dev
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

bench: install
	$(PY) manage.py bench_ingest
	$(PY) manage.py bench_pages
