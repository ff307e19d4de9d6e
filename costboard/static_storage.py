"""The static files storage `collectstatic` writes with: whitenoise's hashed names with gzip and
brotli copies beside them, brotli at quality 9 instead of its default 11.

Quality 11 took 15 s for plotly.js alone (4.8 MB), twice over (its plain and its hashed name),
most of `make run`'s first start on a small machine. Quality 9 packs plotly.js in about 1 s, to
1.23 MB against 1.11 MB: 11 % more bytes, once per browser. With only the hashed names kept
(settings: WHITENOISE_KEEP_ONLY_HASHED_FILES), collectstatic went from 54 s to about 8 s
(docs/operations.md, "Static files").
"""

from __future__ import annotations

from typing import Any

import brotli
from whitenoise.compress import Compressor
from whitenoise.storage import CompressedManifestStaticFilesStorage

BROTLI_QUALITY = 9

# whitenoise ships no type hints: its classes are Any to mypy, so subclassing them is [misc]


class QuickBrotliCompressor(Compressor):  # type: ignore[misc]
    @staticmethod
    def compress_brotli(data: bytes) -> bytes:
        return bytes(brotli.compress(data, quality=BROTLI_QUALITY))


class CompressedManifestStorage(CompressedManifestStaticFilesStorage):  # type: ignore[misc]
    def create_compressor(self, **kwargs: Any) -> Compressor:
        return QuickBrotliCompressor(**kwargs)
