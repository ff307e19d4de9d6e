"""Latency histograms: log-spaced buckets (20 per decade) and percentiles read from them.

Bucket 0 holds calls under 1 ms; bucket b ≥ 1 holds [10^((b-1)/20), 10^(b/20)) ms. A
percentile is interpolated geometrically inside its bucket, so it is within ~6% of the exact
value whatever the number of calls, and the pages never read steps to compute it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from costboard.models import LATENCY_BUCKETS_PER_DECADE as PER_DECADE


def latency_bucket(duration_ms: int) -> int:
    if duration_ms < 1:
        return 0
    return math.floor(math.log10(duration_ms) * PER_DECADE) + 1


def bucket_bounds(bucket: int) -> tuple[float, float]:
    if bucket <= 0:
        return 0.0, 1.0
    return 10 ** ((bucket - 1) / PER_DECADE), 10 ** (bucket / PER_DECADE)


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """The q-quantile (0 < q ≤ 1) in ms of the calls counted in `histogram` (bucket → calls)."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for bucket in sorted(histogram):
        count = histogram[bucket]
        if count and seen + count >= rank:
            low, high = bucket_bounds(bucket)
            fraction = (rank - seen) / count
            if low == 0:
                return high * fraction
            growth: float = (high / low) ** fraction  # float ** float is Any in typeshed
            return low * growth
        seen += count
    return bucket_bounds(max(histogram))[1]
