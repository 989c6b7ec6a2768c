"""(b) Fairness across workers: flows share a level's seats equally even when their connections
are spread over both Envoy workers, and a heavy flow cannot take a quiet flow's share."""

from __future__ import annotations

from statistics import median

import pytest

import client
from apf_policy import E2E_GROUP, single_level_config
from contract import assert_all_200_or_429

pytestmark = pytest.mark.apf

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


def test_heavy_user_does_not_take_quiet_users_share(gateway):
    # Hand size 1: each flow has one queue, so fair queuing gives each backlogged queue an equal
    # share of the seats (with a larger hand a single heavy flow may spread over several queues
    # and legitimately earn several shares, as upstream). The quiet user's demand (1 connection,
    # 1 seat) is below its fair share (2 of 4 seats): it must get nearly all of it although the
    # heavy user sends 20x as many concurrent requests.
    gw = gateway(single_level_config(SEATS, queues=16, hand_size=1, queue_length_limit=50))
    groups = {u: (E2E_GROUP,) for u in ("heavy", "quiet")}
    res = gw.closed_loop({"heavy": 20, "quiet": 1}, DURATION, path=PATH, groups_of=groups, timeout=20)
    assert not [r for r in res if r.status is None], gw.fail_msg("transport errors")
    assert_all_200_or_429(res)
    quiet = [r for r in res if r.user == "quiet"]
    q_ok, h_ok = served(res, "quiet"), served(res, "heavy")
    assert q_ok >= 0.9 * len(quiet), f"quiet user rejected: {client.status_counts(quiet)}"
    # Alone, one closed-loop connection completes about DURATION / LATENCY requests; FIFO without
    # fairness would give it ~1/21 of the service (≈ 8 requests). It waits at most for a seat or
    # two to free up. (On a loaded machine the client's own turnaround lowers the count, so the
    # bound leaves room; the latency comparison below does not depend on the machine's speed.)
    quiet_max = DURATION / LATENCY
    assert q_ok >= 0.4 * quiet_max, f"quiet served {q_ok} of max {quiet_max:.0f} (heavy {h_ok})"
    # Per connection the quiet user is served several times as often as a heavy connection, and
    # its requests do not wait behind the heavy backlog: under FIFO both would be about equal.
    assert q_ok >= 2.5 * h_ok / 20, f"quiet served {q_ok}, heavy {h_ok} over 20 connections"
    q_lat = median(r.elapsed for r in quiet if r.status == 200)
    h_lat = median(r.elapsed for r in res if r.user == "heavy" and r.status == 200)
    assert q_lat <= 0.5 * h_lat, f"quiet median latency {q_lat:.3f}s, heavy {h_lat:.3f}s"
    assert gw.upstream.snapshot()["max_in_flight"] <= SEATS
