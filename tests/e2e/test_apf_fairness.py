"""(b) Fairness across workers: flows share a level's seats equally even when their connections
are spread over both Envoy workers, and a quiet closed-loop user keeps its throughput beside a
heavy one (with 1 and with 2 workers)."""

from __future__ import annotations

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.contract import assert_all_200_or_429
from apfkit.phases import JITTER, SERVICE_MS, pct, run_phase, service_headers

pytestmark = [pytest.mark.apf, pytest.mark.core]

SEATS = 4
LATENCY = 0.1
DURATION = 4.0
PATH = f"/api/v1/namespaces/default/pods?sleep={LATENCY}"


def served(results, user):
    return sum(1 for r in results if r.user == user and r.status == 200)


def test_equal_demand_gets_equal_service(gateway):
    # One queue per flow (hand size 1): fair queuing then alternates strictly between the two
    # backlogged flows. (With larger hands, overlapping hands legitimately give unequal shares.)
    gw = gateway(single_level_config(SEATS, queues=16, hand_size=1, queue_length_limit=50))
    groups = {u: (E2E_GROUP,) for u in ("alice", "bob")}
    res = gw.closed_loop({"alice": 8, "bob": 8}, DURATION, path=PATH, groups_of=groups, timeout=20)
    assert not [r for r in res if r.status is None], gw.fail_msg("transport errors")
    assert_all_200_or_429(res)
    a, b = served(res, "alice"), served(res, "bob")
    snap = gw.upstream.snapshot()
    assert snap["max_in_flight"] <= SEATS, snap
    ideal = SEATS * DURATION / LATENCY
    assert a + b >= 0.5 * ideal, f"throughput too low: {a}+{b} of ~{ideal:.0f} {client.status_counts(res)}"
    assert abs(a - b) <= 0.10 * max(a, b), f"unfair: alice={a} bob={b}"
    workers = gw.worker_connections()
    assert len(workers) == 2 and all(v > 0 for v in workers.values()), workers


# -- a quiet closed-loop user beside a heavy one ----------------------------------------------
#
# Closed loops: every connection sends its next request when the previous answer returns, so a
# request that waits in a queue directly costs its user throughput (an open-loop flow below
# capacity is "fully served" whatever it waited). The upstream's service time varies (±20 %
# around 50 ms, drawn per request from seeded generators): with a constant service time the
# seats phase-lock (seats free up in bursts, each taken by an already waiting heavy request) and
# a quiet request now and then waits a whole service time, which no real apiserver does.
#
# Phases on one gateway, in this order: A, the quiet user alone; B, the quiet user beside the
# heavy one (the measurement); C, the control: the same quiet user beside a heavy user with only
# as many connections as the quiet one leaves seats, both in `system:masters`, so classified
# into the exempt level (same Envoy, same module, same upstream rate, no queuing): what the
# machine's load alone costs the quiet user; A again (A's rate is the mean of both, so a drift of
# the machine's speed during the test cancels out).

LEVEL_SEATS = 18
HEAVY_CONNS = 40
QUIET_CONNS = 4
RELEASE_MS = SERVICE_MS / LEVEL_SEATS  # mean interval between seat releases when saturated
ALONE_SECONDS = 3.0  # twice
CONTENDED_SECONDS = 6.0
CONTROL_SECONDS = 4.5
KEPT_MIN = 0.90
LEVEL_GROUPS = (E2E_GROUP,)
EXEMPT_GROUPS = (E2E_GROUP, "system:masters")  # the exempt FlowSchema (precedence 1) wins


@pytest.mark.parametrize("concurrency", [1, 2])
def test_quiet_closed_loop_user_keeps_its_throughput_beside_a_heavy_one(gateway, concurrency):
    # Hand size 6 over 128 queues (the suggested global-default's shape): the heavy user spreads
    # over its hand's queues; the quiet user's few requests each find an empty queue of their own
    # hand, and fair queuing serves a newly non-empty queue at one of the next seat releases.
    cfg = single_level_config(LEVEL_SEATS, queues=128, hand_size=6, queue_length_limit=50,
                              explainGroups=[E2E_GROUP])
    gw = gateway(cfg, concurrency=concurrency)
    gw.upstream.set_nodelay()  # the service time is the x-sleep-ms asked, not +40 ms of Nagle

    # The quiet user's connections draw the same service times beside the heavy user as alone
    # (the second alone phase continues the first one's sequences; together they take about as
    # many draws as the contended phase): the comparison does not depend on the luck of the draw.
    alone_draws = service_headers()
    alone1 = run_phase(gw, {"quiet": QUIET_CONNS}, ALONE_SECONDS, LEVEL_GROUPS, alone_draws)
    both = run_phase(gw, {"quiet": QUIET_CONNS, "heavy": HEAVY_CONNS}, CONTENDED_SECONDS,
                     LEVEL_GROUPS)
    max_in_flight = gw.upstream.snapshot()["max_in_flight"]
    control = run_phase(gw, {"quiet": QUIET_CONNS, "heavy": LEVEL_SEATS - QUIET_CONNS},
                        CONTROL_SECONDS, EXEMPT_GROUPS)
    alone2 = run_phase(gw, {"quiet": QUIET_CONNS}, ALONE_SECONDS, LEVEL_GROUPS, alone_draws)

    a1, a2 = alone1.flows["quiet"], alone2.flows["quiet"]
    alone_rate = (a1.served + a2.served) / (a1.window + a2.window)
    q, h = both.flows["quiet"], both.flows["heavy"]
    cq, ch = control.flows["quiet"], control.flows["heavy"]
    kept, control_kept = q.rate / alone_rate, cq.rate / alone_rate
    # Where the quiet user's time went: per request on one connection, the cycle alone, plus its
    # mean queue wait (the header counts whole milliseconds: +0.5), plus the rest (the machine).
    cycle_alone = 1000 * QUIET_CONNS / alone_rate
    cycle_both = 1000 * QUIET_CONNS / q.rate if q.rate else float("inf")
    mean_wait = (sum(q.waits_ms) / len(q.waits_ms) + 0.5) if q.waits_ms else float("nan")
    report = (
        f"[{concurrency} worker{'s' if concurrency > 1 else ''}] {LEVEL_SEATS} seats, service "
        f"{SERVICE_MS:.0f} ms ±{JITTER:.0%} (a seat frees every {RELEASE_MS:.1f} ms)\n"
        f"  quiet alone:        {alone_rate:.1f} req/s ({a1.rate:.1f} before, {a2.rate:.1f} after)\n"
        f"  quiet beside heavy: {q}; kept {kept:.1%}\n"
        f"  heavy:              {h}; upstream busy {both.busy_seats:.1f} seats\n"
        f"  quiet per request:  {cycle_alone:.1f} ms alone, {cycle_both:.1f} ms beside heavy ="
        f" + {mean_wait:.1f} ms queued + {cycle_both - cycle_alone - mean_wait:.1f} ms other\n"
        f"  control (exempt, heavy {LEVEL_SEATS - QUIET_CONNS} conns, upstream busy "
        f"{control.busy_seats:.1f} seats): quiet {cq.rate:.1f} req/s, kept {control_kept:.1%};"
        f" heavy {ch.rate:.1f} req/s")
    print("\n" + report)

    for ph, level in ((alone1, "e2e-level"), (both, "e2e-level"), (control, "exempt"),
                      (alone2, "e2e-level")):
        res = ph.results
        assert not [r for r in res if r.status is None], gw.fail_msg(f"transport errors\n{report}")
        assert all(r.status == 200 for r in res), f"{client.status_counts(res)}\n{report}"
        assert all(r.h("x-apf-prioritylevel") == level for r in res), f"not all in {level}"
        if level != "exempt":
            assert all(r.h("x-apf-seats") == "1" for r in res), "every GET costs one seat"
    assert max_in_flight <= LEVEL_SEATS, max_in_flight
    if concurrency == 2:
        workers = gw.worker_connections()
        assert len(workers) == 2 and all(v > 0 for v in workers.values()), workers
    # The level was saturated and kept busy: the heavy user's requests queued about
    # (40 − 14 seats) / 14 service times on average (Little's law), and a freed seat was taken
    # again at once (the upstream busy with nearly all the seats).
    assert both.busy_seats >= 0.85 * LEVEL_SEATS, f"seats left idle\n{report}"
    assert sum(h.waits_ms) / len(h.waits_ms) >= SERVICE_MS, f"heavy user hardly queued\n{report}"

    # The quiet user waits for about the next seat release, not behind the heavy backlog, and
    # keeps its throughput: per connection it is served far more often than the heavy user.
    assert pct(q.waits_ms, 0.5) <= 2 * RELEASE_MS, f"quiet user queued too long\n{report}"
    assert q.rate / QUIET_CONNS >= 2 * h.rate / HEAVY_CONNS, f"quiet served like heavy\n{report}"
    # ≥ 90 % of its standalone throughput; on a loaded machine the control (no queuing at all)
    # loses some too, and what the machine takes from both is not APF's: the bar then applies
    # to the quiet user's throughput relative to the control's.
    machine = min(1.0, control_kept)
    assert kept >= KEPT_MIN * machine, f"quiet user lost throughput (control kept {control_kept:.1%})\n{report}"
