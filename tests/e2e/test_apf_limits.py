"""(a) Never over the limit: a level with N seats never has more than N requests at the upstream,
across both Envoy workers; excess requests queue (or are rejected with 429), none fails or hangs."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, fs_uid, pl_uid, single_level_config
from apfkit.contract import assert_all_200_or_429, assert_classified
from apfkit.envoyproc import wait_until

pytestmark = [pytest.mark.apf, pytest.mark.core]

SEATS = 4
LATENCY = 0.2


def test_level_never_exceeds_its_seats(gateway):
    gw = gateway(single_level_config(SEATS, queues=16, hand_size=4, queue_length_limit=50))
    res = gw.concurrent(60, 20, ["alice", "bob", "carol"],
                        path=f"/api/v1/namespaces/default/pods?sleep={LATENCY}",
                        groups=(E2E_GROUP,), timeout=20)
    assert len(res) == 60
    errors = [r for r in res if r.status is None]
    assert not errors, gw.fail_msg(f"transport errors/timeouts: {errors[:5]}")
    assert_all_200_or_429(res)
    for r in res:
        assert_classified(r, fs_uid("e2e-users"), pl_uid("e2e-level"))
    snap = gw.upstream.snapshot()
    assert snap["max_in_flight"] <= SEATS, gw.fail_msg(f"over the limit: {snap}")
    assert snap["max_in_flight"] >= SEATS - 1, gw.fail_msg(f"seats left unused: {snap}")
    served = [r for r in res if r.status == 200]
    assert snap["total"] == len(served), snap
    assert len(served) >= 30, client.status_counts(res)
    queued = [r for r in served if r.elapsed > LATENCY + 0.05]
    assert len(queued) >= 10, f"expected queueing, elapsed={sorted(round(r.elapsed, 2) for r in res)}"
    workers = gw.worker_connections()
    assert all(v > 0 for v in workers.values()) and len(workers) == 2, workers


def test_single_seat_serialises_requests(gateway):
    gw = gateway(single_level_config(1, queues=4, hand_size=2, queue_length_limit=20))
    res = gw.concurrent(8, 8, ["u1", "u2"], path="/api/v1/namespaces/default/pods?sleep=0.1",
                        groups=(E2E_GROUP,), timeout=15)
    assert client.status_counts(res) == {200: 8}, gw.fail_msg(str(client.status_counts(res)))
    assert gw.upstream.snapshot()["max_in_flight"] == 1


LEASE_S = 5.0  # gateway/worker.rs LEASE_TTL
REAP_S = 2.0  # gateway/worker.rs REAP_EVERY


def test_a_seat_held_past_the_lease_is_kept_on_an_idle_worker(gateway):
    """One request holds the level's only seat longer than a worker's lease plus a reaping period
    while nothing else runs: its worker's lease must be kept (a Wasm VM's timer renews it; on the
    native host, where a stream only holding seats has no scheduler, the main thread does), so a
    second request still waits for the seat instead of being admitted beside it."""
    hold = LEASE_S + REAP_S + 1.5
    gw = gateway(single_level_config(1, queues=4, hand_size=2, queue_length_limit=20))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(gw.request, f"/api/v1/namespaces/default/pods?sleep={hold}",
                            user="holder", groups=(E2E_GROUP,), timeout=hold + 10)
        wait_until(lambda: gw.upstream.snapshot()["in_flight"] == 1, timeout=10,
                   what="the first request at the upstream")
        # The time under test: a lease lapses LEASE_S after its last renewal, and a reap comes
        # within REAP_S of that.
        time.sleep(LEASE_S + REAP_S)
        second = gw.request("/api/v1/namespaces/default/pods", user="other", groups=(E2E_GROUP,),
                            timeout=hold + 10)
        first = first.result()
    assert first.status == 200 and second.status == 200, gw.fail_msg(f"{first!r} {second!r}")
    assert gw.upstream.snapshot()["max_in_flight"] == 1, gw.fail_msg("the held seat was reaped")
    assert second.elapsed >= 0.5, gw.fail_msg(f"the second request did not wait: {second.elapsed:.2f}s")
    assert "reaped worker slot" not in gw.log_tail(400), gw.fail_msg("a live worker was reaped")
