"""Upstream's work estimate of a LIST in seats, as the tests expect the filter to compute it
(kubernetes-apf.md §6; `request/list_work_estimator.go: estimate`)."""

from __future__ import annotations

import math

# Upstream constants (§6.1).
BYTES_PER_SEAT = 100_000
CACHE_MAX_BYTES = 1_000_000
MAX_LIST_SEATS = 100


def pl_max_seats(nominal_cl: int, hand_size: int) -> int:
    """§6.3: max(1, min(ceil(NominalCL × 0.15), NominalCL div handSize))."""
    return max(1, min(math.ceil(nominal_cl * 0.15), nominal_cl // hand_size))


def list_seats(count: int, avg: int, max_seats: int, from_cache: bool) -> int:
    """§6.4 step 7 (size-based), no limit, no selector; clamped to [1, min(maxSeats, 100)]."""
    total = count * avg
    if from_cache:
        total = min(total, CACHE_MAX_BYTES)
    return max(1, min(math.ceil(total / BYTES_PER_SEAT), max_seats, MAX_LIST_SEATS))
