"""A quiet closed-loop user beside a heavy one when the upstream is asked for a constant service
time: how much the seats phase-lock in Envoy, and the measurement the simulator's prediction of
it is checked against (tests/simulate_closed_loop.rs `measured_service_times_predict_envoy`).

Set-up as that test's fixture (tests/fixtures/scenarios/closed_loop_measured.json): an 18-seat
level (64 queues, hand size 8, queue length limit 50), the quiet user with 4 connections, the
heavy one with 40, every request asking the upstream for exactly 50 ms. The test upstream's
real service times spread over tenths of a millisecond (sleep overshoot), which loosens the
phase lock: the quiet user keeps about 87-90 % of its standalone throughput here (a perfect lock
would leave it about half). With APF_PHASE_LOCK_OUT=FILE the run's measurements (the
upstream's service-time quantiles, the round trip, the share kept) are written there as JSON,
from which the fixture's `serviceTimes` and `roundTrip` were taken."""
from __future__ import annotations

import json
import os
import statistics

import pytest

from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.phases import pct, run_phase

pytestmark = pytest.mark.apf

SERVICE_MS = 50.0
LEVEL = dict(queues=64, hand_size=8, queue_length_limit=50)


def constant_service(user: str, conn: int) -> dict[str, str]:
    return {"x-sleep-ms": f"{SERVICE_MS:.3f}"}


def upstream_ms(gw, phase) -> list[float]:
    """Service times (ms) of the upstream's requests that started in the phase's window."""
    with gw.upstream.stats.lock:
        events = list(gw.upstream.stats.events)
    return sorted((e - s) * 1e3 for s, e, _, _ in events if phase.t0 <= s <= phase.t1)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_constant_service_phase_locks_partly(gateway, concurrency):
    gw = gateway(single_level_config(18, explainGroups=[E2E_GROUP], **LEVEL), concurrency=concurrency)
    gw.upstream.set_nodelay()
    alone = run_phase(gw, {"quiet": 4}, 4.0, (E2E_GROUP,), constant_service)
    alone_ms = upstream_ms(gw, alone)
    elapsed = [r.elapsed * 1e3 for r in alone.results
               if r.status == 200 and alone.t0 <= r.started + r.elapsed <= alone.t1]
    both = run_phase(gw, {"quiet": 4, "heavy": 40}, 20.0, (E2E_GROUP,), constant_service)
    served_ms = upstream_ms(gw, both)
    q = both.flows["quiet"]
    kept = q.rate / alone.flows["quiet"].rate
    round_trip = statistics.mean(elapsed) - statistics.mean(alone_ms)
    report = (f"[{concurrency} worker(s)] quiet kept {kept:.1%}, wait p50 {pct(q.waits_ms, 0.5)} / p90 "
              f"{pct(q.waits_ms, 0.9)} / p99 {pct(q.waits_ms, 0.99)} / max {max(q.waits_ms, default=0)} ms; upstream service p10 "
              f"{pct(served_ms, 0.1):.3f} / p50 {pct(served_ms, 0.5):.3f} / p90 {pct(served_ms, 0.9):.3f} ms; "
              f"round trip {round_trip:.2f} ms")
    print("\n" + report)
    out = os.environ.get("APF_PHASE_LOCK_OUT")
    if out:
        quantiles = [pct(served_ms, (i + 0.5) / 100) for i in range(100)]
        with open(f"{out}.{concurrency}.json", "w") as f:
            json.dump({"kept": kept, "round_trip_ms": round_trip, "wait_ms": q.waits_ms,
                       "service_ms_quantiles": quantiles, "service_ms": served_ms}, f)
    assert all(r.status == 200 for r in both.results), report
    assert len(served_ms) > 1000, report
    # The requests asked for a constant 50 ms; the upstream served them a little later and not
    # all alike: that spread is what loosens the lock.
    assert SERVICE_MS <= pct(served_ms, 0.1) < pct(served_ms, 0.9) < SERVICE_MS + 5, report
    # Partly locked: the quiet user loses some throughput to the phases (a perfect lock: about
    # half; fair queuing with jittered service: > 90 %), and its requests hardly ever wait much
    # more than one service time. Its longest wait is bounded looser: on a shared 2-core machine
    # one request in a thousand can sit through a stall of the processes themselves (the
    # in-process upstream or Envoy descheduled: 247 and 365 ms seen under a full test run, with
    # the round trip and the upstream's p90 up at the same time), which no queue discipline
    # causes or prevents; queuing that put the quiet user behind the heavy one would show in
    # its 99th percentile. The share kept also falls when the machine is loaded (74.5 % seen on
    # a CI runner whose round trip was 6.2 ms against about 1 ms here): the lower bound only
    # separates a partial lock from a perfect one (about half).
    assert 0.65 <= kept <= 0.97, report
    assert pct(q.waits_ms, 0.99) <= 2.2 * SERVICE_MS, report
    assert max(q.waits_ms, default=0) <= 10 * SERVICE_MS, report
