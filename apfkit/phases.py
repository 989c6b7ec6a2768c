"""Closed-loop phases on one gateway: users with a number of connections each, the upstream's
service time drawn per request, and per user what a phase's measurement window served and how
long it queued (`x-apf-queued-ms`). The measurement of a quiet user beside a heavy one
(tests/e2e/test_apf_fairness.py, test_apf_phase_lock.py)."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

SERVICE_MS = 50.0
JITTER = 0.20
WARMUP = 0.5  # seconds discarded at the start of every phase (connections, queues filling up)
FAIR_PATH = "/api/v1/namespaces/default/pods/demo-pod"  # a GET: one seat


def service_headers(seed: str = "fairness"):
    """`headers_for` for client.closed_loop: a per-request `x-sleep-ms`, uniform in
    SERVICE_MS·(1 ± JITTER), from one generator per (user, connection) seeded from `seed`, so
    connection i of a user draws the same sequence whatever the threads' interleaving. A new
    instance starts every sequence afresh; passed to several phases, it continues them."""
    rngs: dict[tuple[str, int], random.Random] = {}

    def headers_for(user: str, conn: int) -> dict[str, str]:
        rng = rngs.get((user, conn))
        if rng is None:  # each key is only ever touched by its connection's own thread
            rng = rngs[(user, conn)] = random.Random(f"{seed}/{user}/{conn}")
        ms = SERVICE_MS * (1.0 + rng.uniform(-JITTER, JITTER))
        return {"x-sleep-ms": f"{ms:.3f}"}

    return headers_for


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]); NaN for no samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass
class Flow:
    """One user's closed-loop requests completed inside a phase's measurement window."""
    user: str
    conns: int
    window: float
    served: int
    waits_ms: list[int]  # x-apf-queued-ms of those responses

    @property
    def rate(self) -> float:
        return self.served / self.window

    def waits(self) -> str:
        if not self.waits_ms:
            return "no waits"
        w = self.waits_ms
        return (f"wait p50 {pct(w, 0.5)} / p90 {pct(w, 0.9)} / max {max(w)} ms "
                f"(mean {sum(w) / len(w):.1f})")

    def __str__(self) -> str:
        return f"{self.user} {self.conns} conns {self.rate:.1f} req/s, {self.waits()}"


@dataclass
class Phase:
    flows: dict[str, Flow]
    results: list
    t0: float
    t1: float
    busy_seats: float  # upstream requests in flight, averaged over the window


def run_phase(gw, conns: dict[str, int], seconds: float, groups: tuple[str, ...],
              headers_for=None) -> Phase:
    """Closed loops for `conns` ({user: connections}) for `seconds`, the service times drawn by
    `headers_for` (default: fresh sequences); per user, the requests that completed in
    [start + WARMUP, start + seconds]."""
    gw.upstream.reset()
    start = time.monotonic()
    res = gw.closed_loop(conns, seconds, path=FAIR_PATH, groups_of={u: groups for u in conns},
                         timeout=20, headers_for=headers_for or service_headers())
    t0, t1 = start + WARMUP, start + seconds
    flows = {}
    for user, n in conns.items():
        done = [r for r in res if r.user == user and r.status == 200
                and t0 <= r.started + r.elapsed <= t1]
        waits = [int(r.h("x-apf-queued-ms")) for r in done if r.h("x-apf-queued-ms") is not None]
        flows[user] = Flow(user, n, t1 - t0, len(done), waits)
    # The test upstream runs in this process: its (start, end) times are on the same clock.
    with gw.upstream.stats.lock:
        events = list(gw.upstream.stats.events)
    busy = sum(max(0.0, min(e, t1) - max(s, t0)) for s, e, _, _ in events) / (t1 - t0)
    return Phase(flows, res, t0, t1, busy)
