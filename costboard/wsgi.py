from __future__ import annotations

import gc
import os

from django.conf import settings
from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from costboard.api.chunked import chunked_bodies

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "costboard.settings")
# chunked bodies read when the server decoded them (gunicorn), else the API answers 411
application = chunked_bodies(get_wsgi_application(), limit=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)

# Load every view module now, then move the long-lived objects (Django, the apps, pydantic's
# schemas) out of the collector's reach, and collect less often: a 500-event batch allocates
# enough to trigger dozens of collections, each walking those objects. Measured on ingest:
# a fifth of its CPU for the freeze, a tenth more for the thresholds.
get_resolver().url_patterns  # noqa: B018
gc.freeze()
gc.set_threshold(50_000, 20, 20)
